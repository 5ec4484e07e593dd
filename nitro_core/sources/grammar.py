"""Sources: how a user names a checkpoint, parsed from a whitelist grammar, never evaluated.

The grammar (EBNF); whitespace is free between tokens, a symbol may carry a Julia-style
leading colon (``:latest``), and a text of more than ``MAX_LENGTH`` characters is refused::

    source    = hf | pair | path
    hf        = "hf:" directory  (a Hugging Face model directory: config.json and
                model.safetensors, or shards named by model.safetensors.index.json)
    pair      = run "=>" pick
    run       = "latest" | "all" | run_id | quoted_string
    pick      = "best" | "latest" | average
    average   = "Average" "(" selector { "," option } ")"
    selector  = "Best" "(" int [ ("," | ";") "among" "=" selector ] ")"
              | "Last" "(" int ")" | "Every" "(" int ")"
              | "Epochs" "(" ( int | range | vector ) ")"
    option    = "state" "=" ("best" | "latest")
    range     = int ":" int
    vector    = "[" int { "," int } "]"
    path      = any text without "=>" ending in ".safetensors" (a record file, relative to
                run_dir or absolute) or in "/" (a record directory several processes wrote,
                e.g. "epoch-0003-step-36/"), or a path word: text without "=>" made of
                letters, digits and "_-.=/+@~%" that is no keyword (e.g.
                "runs/reg/epoch-0003-step-36-loss=0.04"); whether a path word names a record
                directory is decided when the source is resolved, on the file system
    run_id    = letters, digits, "_" and "-", not starting with "-", not a keyword
    quoted_string = '"' { any character but '"' } '"'  (or single quotes), not empty

A pair holds "=>" and a path never does, so the two never overlap. Every source prints
back (``str``) in a form that parses to the same structure: a run id that is a keyword or
holds other characters prints quoted (``"my run" => best``).

Every count is bounded by what a run can hold, so parsing any accepted text is linear in
its length and its result is small: an epoch number (``Epochs``' values and range ends,
``Every``'s period) is at most ``MAX_EPOCHS``, a count (``Best``/``Last``'s k, the epochs
of a range) at most ``MAX_COUNT``, and ``among=`` nests at most ``MAX_DEPTH`` deep. A
range is kept by its ends, never expanded.

One tokenizer, one function per rule, frozen dataclasses out, and a
:class:`~nitro_core.errors.SourceSyntaxError` naming the position, what was found and what
was expected.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from nitro_core.errors import ConfigError, SourceSyntaxError
from nitro_core.policy.selectors import MAX_COUNT, MAX_EPOCHS, Best, Epochs, Every, Last, Selector

MAX_LENGTH = 512
MAX_DEPTH = 32  # how deep Best(k; among=...) may nest
_EPOCH = f"an epoch number from 1 to {MAX_EPOCHS} (a run holds at most {MAX_EPOCHS} epochs)"
_COUNT = f"a positive integer up to {MAX_COUNT} (the most records a selector picks)"
_PERIOD = f"a period from 1 to {MAX_EPOCHS} epochs"
PATH_SUFFIX = ".safetensors"
HF_PREFIX = "hf:"  # a Hugging Face model directory
DIRECTORY_SUFFIX = "/"  # a sharded record: a directory (never a file), named with a slash
_KEYWORDS = {
    "latest",
    "all",
    "best",
    "Average",
    "Best",
    "Last",
    "Every",
    "Epochs",
    "among",
    "state",
}


@dataclass(frozen=True)
class Average:
    """Uniformly average the parameters of what ``selector`` picks; layer state comes from
    the best picked record when the selector ranks, else the latest, or as ``state`` says."""

    selector: Selector
    state: Literal["best", "latest"] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.selector, Selector):
            raise ConfigError(
                f"Average({self.selector!r}): give a selector, e.g. Average(Last(10)) or "
                "Average(Best(5, among=Last(20)))."
            )
        if self.state not in (None, "best", "latest"):
            raise ConfigError(f"Average(state={self.state!r}): state is 'best' or 'latest'.")

    def __str__(self) -> str:
        return f"Average({self.selector}" + (f", state={self.state}" if self.state else "") + ")"


@dataclass(frozen=True)
class RunRef:
    """``latest`` (the run that wrote the last entry), ``all``, or a run id."""

    kind: Literal["latest", "all", "id"]
    id: str | None = None

    def __str__(self) -> str:
        if self.kind == "id":
            assert self.id is not None  # a run id always carries its text
            return _quote_run_id(self.id)
        return self.kind


def _quote_run_id(run: str) -> str:
    """A run id as a source writes it, so that it parses back to the same id: bare when it
    is a plain run id (``a1b2c3d4``), else quoted (``"my run"``, ``"latest"``, ``'say "hi"'``).
    The grammar has no escapes, so an id holding both quote characters cannot be written."""
    if _BARE_ID.fullmatch(run) and run not in _KEYWORDS:
        return run
    if '"' not in run:
        return f'"{run}"'
    if "'" not in run:
        return f"'{run}'"
    raise ConfigError(
        f"Run id {run!r} holds both quote characters, so no source can name it (a quoted run "
        "id has no escapes); name its records by path, or 'latest => best' when it wrote last."
    )


Pick = Literal["best", "latest"] | Average


@dataclass(frozen=True)
class Pair:
    """``run => pick``."""

    run: RunRef
    pick: Pick

    def __str__(self) -> str:
        return f"{self.run} => {self.pick}"

    def needs_manifest(self) -> bool:
        """Whether this source names records through a run directory's manifest: a pair."""
        return True

    def averaged(self) -> Average | None:
        """The average this source names (``run => Average(...)``), if it names one."""
        return self.pick if isinstance(self.pick, Average) else None

    def record_path(self) -> str | None:
        """The path or URL of the record this source names by it: none (a pair names
        records by the manifest)."""
        return None

    def hf_directory(self) -> str | None:
        """The Hugging Face directory this source names: none."""
        return None

    def rooted(self, root: Callable[[str], str]) -> Pair:
        """This source with its path rewritten by ``root``: a pair has none."""
        return self


@dataclass(frozen=True)
class PathSource:
    """A record file, or a record directory (several processes wrote it), named by its path;
    which of them it names, if any, is decided at resolution."""

    path: str

    def __str__(self) -> str:
        return self.path

    def needs_manifest(self) -> bool:
        """Whether this source names records through a run directory's manifest: a path
        names its record (or directory) itself."""
        return False

    def averaged(self) -> Average | None:
        """The average this source names: none (a path names one record)."""
        return None

    def record_path(self) -> str | None:
        """The path (or URL) of the record this source names."""
        return self.path

    def hf_directory(self) -> str | None:
        """The Hugging Face directory this source names: none (a record's path)."""
        return None

    def rooted(self, root: Callable[[str], str]) -> PathSource:
        """This source with its path rewritten by ``root`` (confined under a root)."""
        return replace(self, path=root(self.path))


@dataclass(frozen=True)
class HFDirectory(PathSource):
    """``hf:<dir>``: a Hugging Face model directory (what ``save_pretrained`` or
    ``export_hf`` wrote), read by tensor name. A path source, so every check that confines
    a path applies to it too."""

    def __str__(self) -> str:
        return HF_PREFIX + self.path

    def record_path(self) -> str | None:
        return None  # a directory of tensors by name, not a record

    def hf_directory(self) -> str | None:
        return self.path


Source = Pair | PathSource
_BARE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*")  # what the tokenizer reads as one name
_PATH_WORD = re.compile(r"[\w\-.=/+@~%]+")  # a path without spaces, quotes or brackets


# -- the tokenizer ------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<arrow>=>)
  | (?P<int>-?\d+(?![A-Za-z0-9_\-]))
  | (?P<name>:[A-Za-z_][A-Za-z0-9_\-]*|[A-Za-z0-9_][A-Za-z0-9_\-]*)
  | (?P<quoted>"[^"]*"|'[^']*')
  | (?P<punct>[()\[\],;=:])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Tok:
    kind: str  # arrow, int, name, quoted, punct, end
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # reported by the parser when it gets here, in reading order
            tokens.append(_Tok("bad", text[pos], pos))
            break
        if m.lastgroup != "ws":
            value = m.group()
            kind = m.lastgroup or "punct"
            if kind == "name":
                value = value.removeprefix(":")  # Julia symbols: :latest == latest
            elif kind == "quoted":
                value = value[1:-1]
            tokens.append(_Tok(kind, value, m.start()))
        pos = m.end()
    tokens.append(_Tok("end", "", len(text)))
    return tokens


# -- the parser ----------------------------------------------------------------------------------
_PAIR_HINT = (
    "Write a pair such as 'latest => best' or 'latest => Average(Last(10))', or a record's "
    "path (a .safetensors file or a record directory)."
)


class _Parser:
    def __init__(self, text: str, hint: str = _PAIR_HINT, noun: str = "source") -> None:
        self.text = text
        self.hint = hint
        self.noun = noun
        self.tokens = _tokenize(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.tokens[self.i]

    def fail(
        self, expected: str, tok: _Tok | None = None, found: str | None = None, hint: str = ""
    ) -> SourceSyntaxError:
        tok = tok or self.tok
        shown = tok.text if len(tok.text) <= 40 else tok.text[:37] + "..."
        found = found or ("the end of the text" if tok.kind == "end" else repr(shown))
        return SourceSyntaxError(
            f"Cannot parse {self.noun} {self.text!r}: at position {tok.pos} found {found}, expected "
            f"{expected}. {hint or self.hint}"
        )

    def take(self, kind: str, text: str | None = None, expected: str | None = None) -> _Tok:
        tok = self.tok
        if tok.kind != kind or (text is not None and tok.text != text):
            raise self.fail(expected or repr(text))
        self.i += 1
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        return self.tok.kind == kind and (text is None or self.tok.text == text)

    # source = pair
    def source(self) -> Pair:
        pair = self.pair()
        self.take("end", expected="the end of the source")
        return pair

    # pair = run "=>" pick
    def pair(self) -> Pair:
        run = self.run()
        self.take("arrow", expected="'=>'")
        return Pair(run, self.pick())

    # run = "latest" | "all" | run_id | quoted_string
    def run(self) -> RunRef:
        tok = self.tok
        if tok.kind == "quoted":
            if not tok.text:
                raise self.fail(
                    "a run: latest, all, a run id or a quoted run id",
                    found="an empty quoted run id",
                    hint="Write the run's id, e.g. 'a1b2c3d4 => best' (nitro runs lists them), or "
                    "'latest => best' (the latest run's best).",
                )
            self.i += 1
            return RunRef("id", tok.text)
        if tok.kind == "name" and tok.text in ("latest", "all"):
            self.i += 1
            return RunRef("latest" if tok.text == "latest" else "all")
        if tok.kind in ("name", "int") and tok.text not in _KEYWORDS:
            self.i += 1
            return RunRef("id", tok.text)
        raise self.fail("a run: latest, all, a run id or a quoted run id")

    # pick = "best" | "latest" | average
    def pick(self) -> Pick:
        tok = self.tok
        if tok.kind == "name" and tok.text in ("best", "latest"):
            self.i += 1
            return "best" if tok.text == "best" else "latest"
        if self.at("name", "Average"):
            return self.average()
        raise self.fail("best, latest or Average(...)")

    # average = "Average" "(" selector { "," option } ")"
    def average(self) -> Average:
        self.take("name", "Average")
        self.take("punct", "(")
        selector = self.selector()
        state: Literal["best", "latest"] | None = None
        while self.at("punct", ","):
            self.i += 1
            self.take("name", "state", expected="state=best or state=latest")
            self.take("punct", "=")
            tok = self.tok
            if not (tok.kind == "name" and tok.text in ("best", "latest")):
                raise self.fail("best or latest")
            self.i += 1
            state = "best" if tok.text == "best" else "latest"
        self.take("punct", ")", expected="',' or ')'")
        return Average(selector, state)

    # selector = Best(int [;among=selector]) | Last(int) | Every(int) | Epochs(...)
    def selector(self, depth: int = 1) -> Selector:
        tok = self.tok
        if not (tok.kind == "name" and tok.text in ("Best", "Last", "Every", "Epochs")):
            raise self.fail("a selector: Best(k), Last(k), Every(n) or Epochs(...)")
        if depth > MAX_DEPTH:
            raise self.fail(f"a selector nested at most {MAX_DEPTH} deep in among=")
        self.i += 1
        self.take("punct", "(")
        value: Selector
        if tok.text == "Epochs":
            value = self.epochs()
        elif tok.text == "Every":
            value = Every(self.int(MAX_EPOCHS, _PERIOD))
        else:
            k = self.int(MAX_COUNT, _COUNT)
            if tok.text == "Best" and (self.at("punct", ",") or self.at("punct", ";")):
                self.i += 1
                self.take("name", "among", expected="among=")
                self.take("punct", "=")
                value = Best(k, among=self.selector(depth + 1))
            else:
                value = Best(k) if tok.text == "Best" else Last(k)
        self.take("punct", ")", expected="')'")
        return value

    # Epochs( int | range | vector ), kept by its ends (a range is never expanded)
    def epochs(self) -> Epochs:
        if self.at("punct", "["):
            self.i += 1
            values = [self.int(MAX_EPOCHS, _EPOCH)]
            while self.at("punct", ","):
                self.i += 1
                values.append(self.int(MAX_EPOCHS, _EPOCH))
            self.take("punct", "]", expected="',' or ']'")
            return Epochs(values)
        first = self.int(MAX_EPOCHS, _EPOCH)
        if self.at("punct", ":"):
            self.i += 1
            end = self.tok
            last = self.int(MAX_EPOCHS, _EPOCH)
            if last < first:
                raise self.fail(f"a range whose end is at least its start {first}", end)
            if last - first >= MAX_COUNT:
                raise self.fail(
                    f"a range of at most {MAX_COUNT} epochs, e.g. {first}:{first + MAX_COUNT - 1}",
                    end,
                )
            return Epochs(range(first, last + 1))
        return Epochs(first)

    # int, from 1 to limit; its digits are counted before it is converted
    def int(self, limit: int, expected: str) -> int:
        tok = self.tok
        if tok.kind != "int":
            raise self.fail("a positive integer")
        digits = tok.text.lstrip("0")
        if tok.text.startswith("-") or not digits or len(digits) > len(str(limit)):
            raise self.fail(expected)
        value = int(digits)
        if value > limit:
            raise self.fail(expected)
        self.i += 1
        return value


def parse_source(text: str) -> Source:
    """Parse a source string into a :class:`Pair` or a :class:`PathSource`.

    Raises :class:`SourceSyntaxError` (a ``ValueError``) for anything else.
    """
    if not isinstance(text, str):
        raise SourceSyntaxError(
            f"A source must be a string, got {type(text).__name__}; write 'latest => best'."
        )
    if len(text) > MAX_LENGTH:
        raise SourceSyntaxError(
            f"Source is {len(text)} characters long; the limit is {MAX_LENGTH}. Write a pair "
            "such as 'latest => best' or a record's path (a .safetensors file or a record directory)."
        )
    stripped = text.strip()
    if stripped.startswith(HF_PREFIX):
        return _hf_directory(text, stripped[len(HF_PREFIX) :].strip())
    if "=>" not in stripped and stripped.endswith((PATH_SUFFIX, DIRECTORY_SUFFIX)):
        return PathSource(stripped)
    if stripped.lstrip(":") in ("best", "latest"):
        word = stripped.lstrip(":")
        raise SourceSyntaxError(
            f"Source {text!r} names a checkpoint but not the run it belongs to; write "
            f"'latest => {word}' (the latest run's {word})"
            + (" or 'all => best' (the best of every run)." if word == "best" else ".")
        )
    if "=>" not in stripped and _PATH_WORD.fullmatch(stripped) and stripped not in _KEYWORDS:
        return PathSource(stripped)  # a record directory, when resolution finds one there
    return _Parser(text).source()


def _hf_directory(text: str, directory: str) -> HFDirectory:
    """``hf:<dir>``: any directory path, but none (``hf:``) or one holding ``=>``."""
    if not directory or "=>" in directory:
        found = "nothing after it" if not directory else "'=>' after it"
        raise SourceSyntaxError(
            f"Cannot parse source {text!r}: 'hf:' takes a Hugging Face model directory and "
            f"found {found}. Write 'hf:' and the directory, e.g. 'hf:models/gpt2-tiny'."
        )
    return HFDirectory(directory)


def parse_average(text: str) -> Average:
    """Parse ``Average(...)`` alone (``restore_best`` takes it as a string)."""
    if len(text) > MAX_LENGTH:
        raise SourceSyntaxError(
            f"Average is {len(text)} characters long; the limit is {MAX_LENGTH}."
        )
    parser = _Parser(
        text, "Write restore_best as true, false or an average such as 'Average(Last(10))'."
    )
    if not parser.at("name", "Average"):
        raise SourceSyntaxError(
            f"Cannot parse {text!r}: at position {parser.tok.pos} expected true, false or "
            "Average(...), e.g. 'Average(Last(10))'."
        )
    average = parser.average()
    parser.take("end", expected="the end of the text")
    return average


def parse_keep(text: str) -> tuple[Selector, ...]:
    """The selectors of a recorded keep, e.g. ``"(Best(3), Last(1))"`` (the manifest's
    ``keep`` field), parsed with the same whitelist grammar and the same limits."""
    hint = "A keep reads like '(Best(3), Last(1))'."
    if not isinstance(text, str):
        raise SourceSyntaxError(f"A keep must be a string, got {type(text).__name__}. {hint}")
    if len(text) > MAX_LENGTH:
        raise SourceSyntaxError(
            f"Keep is {len(text)} characters long; the limit is {MAX_LENGTH}. {hint}"
        )
    parser = _Parser(text, hint, noun="keep")
    parser.take("punct", "(")
    selectors = [parser.selector()]
    while parser.at("punct", ","):
        parser.i += 1
        selectors.append(parser.selector())
    parser.take("punct", ")", expected="',' or ')'")
    parser.take("end", expected="the end of the keep")
    return tuple(selectors)


def to_source(value: object, keyword: str = "source") -> Source:
    """A source from any accepted Python form: a string, a path, or a (run, pick) tuple."""
    if isinstance(value, Pair | PathSource):
        return value
    if isinstance(value, Path):
        return PathSource(str(value))
    if isinstance(value, str):
        return parse_source(value)
    if isinstance(value, tuple) and len(value) == 2:
        run, pick = value
        if isinstance(pick, str):
            return parse_source(f"{_run_text(run)} => {pick}")
        if isinstance(pick, Average):
            latest = parse_source(f"{_run_text(run)} => latest")
            assert isinstance(latest, Pair)  # text with '=>' never parses to a path
            return Pair(latest.run, pick)
    raise ConfigError(
        f"{keyword}={value!r} is not a source; write a string such as 'latest => best', a tuple "
        "such as ('latest', Average(Last(10))), or a path to a .safetensors file."
    )


def _run_text(run: object) -> str:
    if not isinstance(run, str):
        raise ConfigError(
            f"A source's run must be a string, got {run!r}; write 'latest', 'all' or a run id."
        )
    return run if run.lstrip(":") in ("latest", "all") else _quote_run_id(run)
