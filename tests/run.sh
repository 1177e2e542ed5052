#!/usr/bin/env bash
# The full test suite on a fresh Debian 12 machine (Python 3.11, root): installs the SIP peers the
# integration tests call the bridge with, makes .venv, installs the project with its test extra, runs pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh tests/unit -q`.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(sip-tester baresip sox espeak-ng tshark)
missing=()
for deb in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "install ok installed" || missing+=("$deb")
done
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

exec .venv/bin/python -m pytest "$@"
