"""Text from a checkpoint or a hub (ids, card fields, tags, tokenizer strings) is data: these are the escapes for
every format hubtrace writes it into, in one place, so that no writer parses it as markup, math or a command.

Invisible and reordering characters (C0/C1 controls, DEL, bidi overrides and isolates, zero-width characters, line
and paragraph separators, lone surrogates) are first made *visible* as ``\\xNN``/``\\uNNNN`` escapes: an
investigator must see that an id holds them, a terminal must not act on them, and XML 1.0 cannot hold most of them.
Then each format's own escaping applies. Every function returns a string that is safe where its name says and
equal to the input when the input is plain text. Where the text is an identity (a node id in GraphML, GEXF or DOT),
the escape must also be reversible, or an id holding a control character would become the same node as an id that
spells out its escape: there a backslash is doubled first (`reversible`).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable
from typing import Any

# Tab and newline are kept where a format allows them (`keep`); everything else here is escaped.
_INVISIBLE = re.compile(
    "[\x00-\x1f\x7f-\x9f"                  # C0 and C1 controls, DEL (ESC starts terminal sequences)
    "\u2028\u2029"                         # line and paragraph separators
    "\ud800-\udfff"                         # lone surrogates (json.loads lets them in; UTF-8 cannot encode them)
    # Unicode's Default_Ignorable_Code_Point: drawn as nothing, so `acme/ba<U+00AD>se` shows as `acme/base`
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164"
    "\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
    # noncharacters, which XML 1.0 forbids (U+FFFE and U+FFFF made GraphML and GEXF ill-formed)
    "\ufdd0-\ufdef" + "".join(chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17))
    + "]"
)
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>!|&~#$])")
_CSV_FORMULA = ("=", "+", "-", "@")
_CSV_FORMULA_START = ("\t", "\r")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: object, *, keep: str = "") -> str:
    """str(text) with invisible and reordering characters written as ``\\xNN``/``\\uNNNN`` (those in keep left)."""
    text = str(text)
    if _plain(text):
        return text
    return _INVISIBLE.sub(lambda m: m.group() if m.group() in keep else _escape_char(m), text)


def _plain(text: str) -> bool:
    """Printable ASCII, which holds no invisible character: told at C speed (the pattern scans at ~12 MB/s, and a
    download of wide text cells goes through it)."""
    return text.isascii() and text.isprintable()


def reversible(text: object, *, keep: str = "") -> str:
    """`visible`, with every backslash doubled first, so the escape can be undone and two different texts never
    come out the same (``"a\\x01"`` spelled out is not the control character U+0001 made visible)."""
    return visible(str(text).replace("\\", "\\\\"), keep=keep)


def terminal(text: object) -> str:
    """One terminal line: no escape sequence (colours, OSC 8 hyperlinks, cursor moves), no bidi reordering."""
    return visible(text)


def terminal_lines(text: str) -> str:
    """Several terminal lines (a table hubtrace laid out): each line as `terminal`, the line breaks kept."""
    return "\n".join(terminal(line) for line in text.split("\n"))


def json_visible(text: str) -> str:
    """JSON text with every invisible or reordering character inside its strings as a ``\\uXXXX`` escape: the same
    JSON value, safe to print on a terminal (json.dumps escapes C0 controls but not C1 or bidi overrides)."""
    # json.dumps escapes C0 inside strings, so a raw newline or tab is indentation and stays
    if _plain(text):
        return text
    return _INVISIBLE.sub(lambda m: m.group() if m.group() in "\t\n\r" else _json_escape(m.group()), text)


def _json_escape(char: str) -> str:
    """A character as JSON's \\uXXXX escape: a surrogate pair above the BMP (tag characters, plane noncharacters)."""
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def html_text(text: object) -> str:
    """HTML text or a quoted attribute value: ``& < > " '`` as entities, invisible characters visible."""
    return html.escape(visible(text), quote=True)


def script_json(data: Any) -> str:
    """JSON for inside ``<script>``: no ``</script>``, ``<!--`` or ``]]>`` can end or change the script element
    (``<``, ``>``, ``&`` as \\u escapes), and U+2028/U+2029 escaped for old JavaScript parsers."""
    text = json.dumps(_finite(data), default=str, ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def json_document(data: Any, *, indent: int | None = None, default: Callable[[Any], Any] = str) -> str:
    """A JSON document any parser reads: NaN and infinities as null (Python would write NaN and Infinity, which
    JSON has not), anything else non-JSON through ``default`` (its str unless said)."""
    return json.dumps(_finite(data), default=default, indent=indent, ensure_ascii=False, allow_nan=False)


def _finite(data: Any) -> Any:
    """NaN and infinities as null: JSON has no such numbers and JSON.parse refuses the page's data over one."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def xml_text(text: object) -> str:
    """Text that XML 1.0 can hold (GraphML, GEXF): characters it forbids written visibly (`reversible`: node ids
    stay distinct), tab and newline kept. Markup characters are left to the XML writer, which escapes them."""
    return reversible(text, keep="\t\n")


def dot_string(text: object) -> str:
    """A double-quoted Graphviz string: backslashes doubled (so ``\\l``, ``\\N``, ``\\G`` stay text), quotes
    escaped, invisible characters visible and `reversible` (a newline becomes the two characters ``\\n``, never
    a line break, and node ids stay distinct)."""
    return '"' + reversible(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


PLOT_TEXT = {"parse_math": False, "usetex": False}
"""Keyword arguments for every matplotlib text that can hold hub text: no mathtext (``$...$``), no LaTeX run."""


def plot_label(text: object) -> str:
    """A matplotlib label, drawn with `PLOT_TEXT`: invisible characters visible (a NUL or an escape has no glyph)."""
    return visible(text)


def markdown_text(text: object) -> str:
    """Markdown inline text that renders as exactly these characters: every character that could start
    emphasis, a link or image, raw HTML, an entity, a table cell, code, math or a heading is backslash-escaped,
    and newlines are visible, so card text cannot open a new block (a heading, a second verdict line)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", visible(text))


def markdown_code(text: object) -> str:
    """A Markdown code span around the text, fenced with more backticks than any run inside it."""
    body = visible(text)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or not body.strip() else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def csv_cell(text: str) -> str:
    """A CSV text cell that a spreadsheet will not run as a formula (``=cmd|...``): a leading ``'`` where the
    first character that is not white space (spaces, tabs, CR and LF, any Unicode space) is ``= + - @``, and where
    the text starts with a tab or a carriage return (the OWASP rule); invisible characters visible. The writer
    must quote a cell holding CR or LF (jobs.exports writes RFC 4180: CRLF line ends, so it does)."""
    text = visible(text, keep="\t\r\n")
    return "'" + text if text.startswith(_CSV_FORMULA_START) or text.lstrip().startswith(_CSV_FORMULA) else text
