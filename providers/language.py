"""A call's language (a BCP 47 tag such as "de-DE", `SessionSettings.language`) as each provider protocol takes it.

Each adapter puts the language where its protocol has a field for it (shared/reference/providers.md), and a
line in the instructions where it has none for the model's own speech (the adapter's docstring says which):

- `iso639_1`: the input-transcription language of the OpenAI Realtime family (`transcription.language` on
  OpenAI, `transcription.language_hint` on xAI): an ISO 639-1 code, "de" of "de-DE".
- `gemini_language_code`: Gemini Live's `speechConfig.languageCode`, one of the BCP 47 codes its
  documentation lists for the Live API (`GEMINI_LANGUAGES`); a bare language ("de") is its one listed code.
- `speak_line`: "Speak German (de-DE)." appended to the instructions, for the model's spoken language.

A language a protocol cannot carry raises ValueError with what it takes instead: the bridge refuses to start
with it (bridge/cli/ops.py) rather than drop it, and an adapter refuses to be built with it.
"""

from __future__ import annotations

# ISO 639-1: the two-letter codes (BCP 47 uses them where one exists, RFC 5646 §2.2.1).
ISO_639_1 = frozenset(
    """aa ab ae af ak am an ar as av ay az ba be bg bi bm bn bo br bs ca ce ch co cr cs cu cv cy da de dv dz
    ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu hy hz ia id ie ig ii ik
    io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml
    mn mr ms mt my na nb nd ne ng nl nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd
    se sg si sk sl sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi
    vo wa wo xh yi yo za zh zu""".split()
)

# Gemini Live's supported languages (Google Cloud, "Configure language and voice", Live API): BCP 47 codes.
GEMINI_LANGUAGES = (
    "ar-EG", "bn-BD", "de-DE", "en-IN", "en-US", "es-US", "fr-FR", "hi-IN", "id-ID", "it-IT", "ja-JP",
    "ko-KR", "mr-IN", "nl-NL", "pl-PL", "pt-BR", "ro-RO", "ru-RU", "ta-IN", "te-IN", "th-TH", "tr-TR",
    "uk-UA", "vi-VN",
)  # fmt: skip

_NAMES = {
    "ar": "Arabic", "bn": "Bengali", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "fi": "Finnish", "fr": "French", "he": "Hebrew", "hi": "Hindi",
    "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "mr": "Marathi",
    "nb": "Norwegian", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "sv": "Swedish", "ta": "Tamil", "te": "Telugu", "th": "Thai", "tr": "Turkish",
    "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip


def primary(tag: str) -> str:
    """The primary language subtag, lower-case ("de" of "de-DE")."""
    return tag.split("-", 1)[0].lower()


def iso639_1(tag: str) -> str:
    """The ISO 639-1 code of `tag` ("de" of "de-DE"); ValueError when its language has none ("yue", "fil")."""
    code = primary(tag)
    if code not in ISO_639_1:
        raise ValueError(
            f"{tag!r}: input transcription takes an ISO 639-1 language (two letters, like de or en-GB); "
            f"{code!r} is not one"
        )
    return code


def gemini_language_code(tag: str) -> str:
    """`speechConfig.languageCode` for `tag`: the listed code it names (case-insensitive), or the one listed
    code of a bare language ("de" -> "de-DE"); ValueError when it is not listed or a bare language has several."""
    lowered = tag.lower()
    for code in GEMINI_LANGUAGES:
        if code.lower() == lowered:
            return code
    candidates = [code for code in GEMINI_LANGUAGES if primary(code) == primary(tag)]
    if "-" not in tag and len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise ValueError(f"{tag!r}: Gemini Live speaks {primary(tag)} as {' or '.join(candidates)}: give one")
    raise ValueError(f"{tag!r}: Gemini Live speaks none of it; its languages: {', '.join(GEMINI_LANGUAGES)}")


def speak_line(tag: str) -> str:
    """The instruction that sets the model's spoken language: "Speak German (de-DE)."."""
    name = _NAMES.get(primary(tag))
    return f"Speak {name} ({tag})." if name else f"Speak the language {tag} (BCP 47)."


def with_speak_line(instructions: str | None, tag: str | None) -> str | None:
    """`instructions` with `speak_line(tag)` after them; unchanged without a language."""
    if not tag:
        return instructions
    return f"{instructions or ''}\n\n{speak_line(tag)}".strip()
