"""How the tools read loosely typed arguments, one rule for all of them.

Tool arguments are validated by the SDK in pydantic's lax mode, where a number given as a
string (``seed="3"``, ``wait_s="5"``) is the number it spells. ``overrides`` reach an
experiment whose config is strict (the record must hold exactly what trained), so the same
rule is applied to them here, before the experiment is built: a string that spells a JSON
number (or ``true``/``false``) is taken as that value when the field takes no string, and a
float with an integral value is an int for an int field. Anything else is left for the
experiment to refuse with its own message.

Flags are strict: a boolean parameter takes a JSON boolean only, so ``dry_run="no"`` or
``force=1`` is refused with the JSON to send, never read as the boolean it may spell.
``resume`` and ``restore_best`` take booleans as well as their strings: ``false`` is
``'false'``, and ``restore_best=true`` is ``'true'``; ``resume=true`` is ambiguous and
refused, naming what to send, and so is a string that spells a boolean in other words
(``resume="no"``, ``restore_best="yes"``).

An argument the SDK refuses (a value of the wrong type, a required one missing, an unknown
one) is answered in the same words as a refused override, not in pydantic's:
``seed='7x' is not an integer; send e.g. seed=0.`` (:func:`argument_errors`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from nitro_core.errors import ConfigError
from nitro_core.experiment import Experiment
from nitro_mcp.echo import clip, clip_text


def coerce_overrides(cls: type[Experiment], overrides: dict[str, Any]) -> None:
    """Rewrite, in place, each override that the rule above turns into a value its field
    takes (unknown fields and values that fit are left alone)."""
    for name, value in list(overrides.items()):
        field = cls.model_fields.get(name)
        if field is None or field.annotation is None:
            continue
        candidate = _candidate(value)
        if candidate is _NONE:
            continue
        adapter: TypeAdapter[Any] = TypeAdapter(field.annotation)
        if not _fits(adapter, value) and _fits(adapter, candidate):
            overrides[name] = candidate


def flag_text(value: bool | str, keyword: str) -> str:
    """``resume`` or ``restore_best`` as the string the job spec and the core take."""
    if value is True and keyword == "resume":
        raise ConfigError(
            "resume=true is ambiguous; send resume='auto' (continue the latest record, or start "
            "fresh when there is none) or a source such as resume='latest => latest'."
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    word = value.strip().lower().removeprefix(":") if isinstance(value, str) else ""
    if (word in _FALSE_WORDS or word in _TRUE_WORDS) and value not in _SPELLED:
        raise ConfigError(f"{keyword}={json.dumps(value)} {_FLAG_WORD[keyword]}")
    return value


_SPELLED = ("true", "false", ":true", ":false")  # the grammar's own words: the core reads them
_FLAG_WORD = {
    "resume": 'is a string that spells a boolean, not a source: send {"resume": false} (a new '
    'run), {"resume": "auto"} (continue the latest record, or start fresh) or a source such as '
    '{"resume": "latest => latest"}.',
    "restore_best": 'is a string that spells a boolean, not an average: send {"restore_best": '
    'false}, {"restore_best": true} (end holding the run\'s best checkpoint) or an average such '
    'as {"restore_best": "Average(Last(10))"}.',
}


_NONE = object()


def _candidate(value: Any) -> Any:
    """The value ``value`` would be under the rule, or ``_NONE`` when the rule does not apply."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, str) or len(value) > 100:
        return _NONE
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return _NONE
    return parsed if isinstance(parsed, bool | int | float) else _NONE


def _fits(adapter: TypeAdapter[Any], value: Any) -> bool:
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


_KIND = {"integer": "an integer", "number": "a number", "boolean": "true or false",
         "string": "a string", "array": "a list", "object": "an object"}  # fmt: skip
_SAMPLE = {
    "integer": 0,
    "number": 1.0,
    "boolean": True,
    "string": "...",
    "array": [],
    "object": {"max_epochs": 3},
}


def argument_errors(schema: dict[str, Any], exc: ValidationError) -> str:
    """The SDK's refusal of a call's arguments as one sentence per argument, each naming
    what the argument takes and a value to send; ``schema`` is the tool's input schema."""
    parts: dict[str, str] = {}  # one per argument: a union reports each of its arms
    for err in exc.errors():
        if err["type"] == "value_error" and not err["loc"]:  # the server's own model check
            parts.setdefault("", str(err.get("ctx", {}).get("error", err["msg"])))
            continue
        name = str(err["loc"][0]) if err["loc"] else "arguments"
        prop = schema.get("properties", {}).get(name, {})
        if err["type"] == "bool_type" and [a.get("type") for a in _arms(prop)] == ["boolean"]:
            parts.setdefault(name, _not_a_boolean(name, err.get("input"), prop))
            continue
        if err["type"] == "missing":
            text = f"{name} is required"
        else:
            text = f"{name}={clip(err.get('input'))} is not {_expected(prop)}"
        parts.setdefault(name, f"{text}; send e.g. {name}={_value(_example(prop))}")
    return "; ".join(parts.values()) + "."


_FALSE_WORDS = ("false", "no", "n", "off", "f", "0")
_TRUE_WORDS = ("true", "yes", "y", "on", "t", "1")


def _not_a_boolean(name: str, given: Any, prop: dict[str, Any]) -> str:
    """A flag sent as anything but a JSON boolean (``dry_run="no"``): refused, never read as
    the boolean it may spell, with the JSON to send (the one it spells, when it spells one)."""
    word = given.strip().lower() if isinstance(given, str) and len(given) < 10 else None
    if isinstance(given, int | float) and given in (0, 1):
        word = str(int(given))
    if word in _FALSE_WORDS or word in _TRUE_WORDS:
        send = json.dumps({name: word in _TRUE_WORDS})
    else:
        send = f"{json.dumps({name: True})} or {json.dumps({name: False})}"
    meaning = str(prop.get("description") or "").rstrip(".")
    return (
        f"{name} must be true or false (a JSON boolean), not {_shown_value(given)}: send {send}"
        + (f" ({meaning})" if meaning else "")
    )


def _shown_value(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {json.dumps(clip_text(value), ensure_ascii=False)}"
    if isinstance(value, int | float):
        return f"the number {clip(value)}"
    if value is None:
        return "null"
    return "a list" if isinstance(value, list) else "an object"


def _arms(prop: dict[str, Any]) -> list[dict[str, Any]]:
    arms = prop.get("anyOf", [prop])
    return [a for a in arms if a.get("type") != "null"] or [prop]


def _expected(prop: dict[str, Any]) -> str:
    words = []
    for arm in _arms(prop):
        if "enum" in arm:
            words.append("one of " + ", ".join(_value(v) for v in arm["enum"]))
        else:
            words.append(_KIND.get(arm.get("type", ""), "a valid value"))
    return " or ".join(dict.fromkeys(words))


def _example(prop: dict[str, Any]) -> Any:
    if prop.get("default") is not None:
        return prop["default"]
    arm = _arms(prop)[0]
    return arm["enum"][0] if "enum" in arm else _SAMPLE.get(arm.get("type", ""), "...")


def _value(value: Any) -> str:
    """A value as a tool call writes it: JSON, strings in single quotes."""
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value)
