#!/usr/bin/env bash
# The full test suite on a fresh Debian 12 machine (Python 3.11, root): installs the SIP peers the
# integration tests call the bridge with, makes .venv, installs the project with its test extra, then runs
# the gates (ruff, mypy --strict), the whole suite with branch coverage, and the unit suite once more on
# Python 3.13 (PYTHON313; pyenv's on these machines) in .venv313.
# Extra arguments go to pytest alone, without the gates, e.g. `bash tests/run.sh tests/unit -q`.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(sip-tester baresip sox espeak-ng tshark kamailio chromium chromium-driver docker-compose sipvicious)
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
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,pjsua2]'

# With arguments: just pytest with them (a quick look at one file, say).
if (($#)); then
  exec .venv/bin/python -m pytest "$@"
fi

# The full run. Every step runs; the run fails if any did. The gates first (ruff check, ruff format --check,
# mypy --strict: about a minute). Beside the parallel part (below), in a background job at nice 19: the
# install of the Python 3.13 venv the unit suite runs on at the end (one to two minutes, 47 s of CPU). The
# parallel part runs its live files first, which mostly wait on real-time calls and leave about a CPU idle (a
# baresip call with a bridge, a fake provider and tshark took 8.8 CPU seconds in 19.8 s). The gates stay in
# front and the 3.13 unit suite (100 s of CPU on both cores) after the serial part: beside the live tests they
# would take the CPU the live tests time their calls on (a barge-in test's caller-side timing failed once with
# the gates beside it).
failed=()
echo "gate: ruff check"; .venv/bin/ruff check . || failed+=("ruff check")
echo "gate: ruff format --check"; .venv/bin/ruff format --check . || failed+=("ruff format")
echo "gate: mypy --strict"; .venv/bin/mypy || failed+=("mypy")
side=$(mktemp -d)
python313=${PYTHON313:-/root/.pyenv/versions/3.13.0/bin/python3.13}
(
  renice -n 19 -p "$BASHPID" >/dev/null || true
  side_failed() { echo "$1" >>"$side/failed"; }
  echo "install on $python313"
  { [ -x .venv313/bin/python ] || "$python313" -m venv .venv313; } &&
    .venv313/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' ||
    side_failed "install on Python 3.13"
) >"$side/log" 2>&1 &
side_pid=$!

# The whole suite with branch coverage of the four packages (in-process code; the `serve` subprocesses of the
# live tests are not traced): on two workers, one test file each at a time (most live tests wait on real-time
# calls), in collection order (--no-loadscope-reorder): the live files first, beside the background job, and
# the unit files, many short tests that use the CPU and no clock, last, so that the two workers end together
# (xdist's default order, by test count, ended on the single-test live files, up to 42 s each). Then the
# modules marked `serial` alone (they load the machine: tests/integration/conftest.py says which and why).
cov=(--cov=bridge --cov=sip --cov=rtp --cov=providers --cov-branch)
.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not serial" "${cov[@]}" \
  --cov-report= --durations=30 || failed+=("pytest (parallel)")
side_rc=0
wait "$side_pid" || side_rc=$?
cat "$side/log"
((side_rc == 0)) || failed+=("Python 3.13 install job (exit $side_rc)")
if [ -s "$side/failed" ]; then
  mapfile -t side_failures <"$side/failed"
  failed+=("${side_failures[@]}")
fi
install313_ok=1
grep -qx "install on Python 3.13" "$side/failed" 2>/dev/null && install313_ok=0
rm -rf "$side"
.venv/bin/python -m pytest -m serial "${cov[@]}" --cov-append --cov-report=term:skip-covered \
  --durations=15 || failed+=("pytest (serial)")

# Coverage floors per package and overall, about a point under what the suite reached on 7 December 2026
# (bridge 90.1 %, sip 87.8 %, rtp 93.3 %, providers 94.6 %; 91 % in all): code that lands without its tests, or
# tests that stop reaching what they did, fail the run here.
for floor in bridge:89 sip:87 rtp:92 providers:93 total:90; do
  pkg=${floor%%:*} min=${floor##*:}
  include=()
  [ "$pkg" = total ] || include=(--include="$pkg/*")
  echo -n "coverage of $pkg (floor $min %): "
  .venv/bin/coverage report "${include[@]}" --fail-under="$min" --format=total || failed+=("coverage of $pkg")
done

# The unit suite again on Python 3.13 (installed by the background job), without pjsua2 (no wheel past 3.12:
# its tests skip there), so that a newer Python cannot silently break the install or the code; the live tests
# stay on .venv's Python. Its property tests and state machines draw at most 20 examples each (the profile
# `smoke`, the plugin tests/support/smoke_profile.py): the run above drew them all.
if ((install313_ok)); then
  echo "unit suite on $python313"
  .venv313/bin/python -m pytest -n 2 tests/unit -p tests.support.smoke_profile --hypothesis-profile smoke || failed+=("pytest (unit, Python 3.13)")
fi
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}"
  exit 1
fi
