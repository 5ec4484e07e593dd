"""The source grammar: a table of accepted and rejected strings, and a property test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nitro_core import (
    Best,
    ConfigError,
    Epochs,
    Every,
    Last,
    SourceSyntaxError,
)
from nitro_core.sources.grammar import (
    Average,
    Pair,
    PathSource,
    RunRef,
    parse_average,
    parse_source,
    to_source,
)

LATEST, ALL = RunRef("latest"), RunRef("all")

ACCEPTED = [
    ("latest => best", Pair(LATEST, "best")),
    ("latest=>best", Pair(LATEST, "best")),
    (":latest => :best", Pair(LATEST, "best")),
    ("  latest   =>   latest  ", Pair(LATEST, "latest")),
    ("all => best", Pair(ALL, "best")),
    ("a1b2c3d4 => latest", Pair(RunRef("id", "a1b2c3d4"), "latest")),
    ('"a1b2c3d4" => latest', Pair(RunRef("id", "a1b2c3d4"), "latest")),
    ("'my run' => best", Pair(RunRef("id", "my run"), "best")),
    ("12345678 => best", Pair(RunRef("id", "12345678"), "best")),
    ("latest => Average(Last(10))", Pair(LATEST, Average(Last(10)))),
    ("latest => Average(Best(5; among=Last(20)))", Pair(LATEST, Average(Best(5, among=Last(20))))),
    ("latest => Average(Best(5, among=Last(20)))", Pair(LATEST, Average(Best(5, among=Last(20))))),
    ("latest => Average(Epochs(3:7))", Pair(LATEST, Average(Epochs(range(3, 8))))),
    ("latest => Average(Epochs([2, 4, 6]))", Pair(LATEST, Average(Epochs([2, 4, 6])))),
    ("latest => Average(Epochs(5))", Pair(LATEST, Average(Epochs(5)))),
    ("latest => Average(Epochs(3:3))", Pair(LATEST, Average(Epochs(3)))),  # a one-epoch range
    ("latest => Average(Epochs(1:100000))", Pair(LATEST, Average(Epochs(range(1, 100_001))))),
    ("latest => Average(Epochs(1000000))", Pair(LATEST, Average(Epochs(1_000_000)))),
    ("latest => Average(Epochs([3, 1000000]))", Pair(LATEST, Average(Epochs([3, 1_000_000])))),
    ("latest => Average(Last(100000))", Pair(LATEST, Average(Last(100_000)))),
    ("latest => Average(Best(0007))", Pair(LATEST, Average(Best(7)))),
    ("latest => Average(Every(1000000))", Pair(LATEST, Average(Every(1_000_000)))),
    (
        "a1b2c3d4 => Average(Epochs(8:10))",
        Pair(RunRef("id", "a1b2c3d4"), Average(Epochs(range(8, 11)))),
    ),
    ("latest => Average(Every(2), state=best)", Pair(LATEST, Average(Every(2), state="best"))),
    ("latest => Average(Last(3), state=:latest)", Pair(LATEST, Average(Last(3), state="latest"))),
    (
        "runs/reg/epoch-0002-step-24.safetensors",
        PathSource("runs/reg/epoch-0002-step-24.safetensors"),
    ),
    ("/abs/avg10.safetensors", PathSource("/abs/avg10.safetensors")),
    # a path word (no '=>'): a record directory when resolution finds one there
    (
        "runs/x/epoch-0003-step-15-loss=0.08",
        PathSource("runs/x/epoch-0003-step-15-loss=0.08"),
    ),
    (
        " epoch-0003-batch-0250-step-4500-loss=0.0416831 ",
        PathSource("epoch-0003-batch-0250-step-4500-loss=0.0416831"),
    ),
    ("runs/x/epoch-0003-step-15-loss=0.08/", PathSource("runs/x/epoch-0003-step-15-loss=0.08/")),
    ("/abs/run/epoch-0001-step-3", PathSource("/abs/run/epoch-0001-step-3")),
    ('"a=>b" => best', Pair(RunRef("id", "a=>b"), "best")),
    ("latest=best", PathSource("latest=best")),  # no '=>': resolution says it names nothing
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_accepted_sources_parse_to_their_structure(text, expected):
    assert parse_source(text) == expected


COUNT = "a positive integer up to 100000 (the most records a selector picks)"
EPOCH = "an epoch number from 1 to 1000000 (a run holds at most 1000000 epochs)"
DEEP = "latest => Average(" + "Best(1;among=" * 33 + "Last(1)" + ")" * 34  # 33 among= levels


def _syntax(pos: int, found: str, expected: str, text: str) -> str:
    return (
        f"Cannot parse source {text!r}: at position {pos} found {found}, expected {expected}. Write "
        "a pair such as 'latest => best' or 'latest => Average(Last(10))', or a record's path (a .safetensors file or a record directory)."
    )


REJECTED = [
    (
        "best",
        "Source 'best' names a checkpoint but not the run it belongs to; write 'latest => best' (the latest run's best) or 'all => best' (the best of every run).",
    ),
    (
        ":latest",
        "Source ':latest' names a checkpoint but not the run it belongs to; write 'latest => latest' (the latest run's latest).",
    ),
    ("latest =>", _syntax(9, "the end of the text", "best, latest or Average(...)", "latest =>")),
    (
        "latest => Average(Last(-1))",
        _syntax(23, "'-1'", COUNT, "latest => Average(Last(-1))"),
    ),
    (
        "latest => Average(Last(0))",
        _syntax(23, "'0'", COUNT, "latest => Average(Last(0))"),
    ),
    ("__import__('os').system('x')", _syntax(10, "'('", "'=>'", "__import__('os').system('x')")),
    (
        "latest => eval('1')",
        _syntax(10, "'eval'", "best, latest or Average(...)", "latest => eval('1')"),
    ),
    (
        "latest => Average(Last(10)",
        _syntax(26, "the end of the text", "',' or ')'", "latest => Average(Last(10)"),
    ),
    (
        "latest => Average(Epochs(7:3))",
        _syntax(
            27, "'3'", "a range whose end is at least its start 7", "latest => Average(Epochs(7:3))"
        ),
    ),
    (
        "latest => Average(Epochs(1:30000000))",
        _syntax(27, "'30000000'", EPOCH, "latest => Average(Epochs(1:30000000))"),
    ),
    (
        "latest => Average(Epochs(1:100001))",
        _syntax(
            27,
            "'100001'",
            "a range of at most 100000 epochs, e.g. 1:100000",
            "latest => Average(Epochs(1:100001))",
        ),
    ),
    (
        "latest => Average(Epochs([2, 1000001]))",
        _syntax(29, "'1000001'", EPOCH, "latest => Average(Epochs([2, 1000001]))"),
    ),
    (
        "latest => Average(Epochs(0:3))",
        _syntax(25, "'0'", EPOCH, "latest => Average(Epochs(0:3))"),
    ),
    (
        "latest => Average(Last(100001))",
        _syntax(23, "'100001'", COUNT, "latest => Average(Last(100001))"),
    ),
    (
        "latest => Average(Best(100001; among=Last(3)))",
        _syntax(23, "'100001'", COUNT, "latest => Average(Best(100001; among=Last(3)))"),
    ),
    (
        "latest => Average(Every(1000001))",
        _syntax(
            24,
            "'1000001'",
            "a period from 1 to 1000000 epochs",
            "latest => Average(Every(1000001))",
        ),
    ),
    (
        "latest => Average(Last(" + "9" * 60 + "))",
        _syntax(23, repr("9" * 37 + "..."), COUNT, "latest => Average(Last(" + "9" * 60 + "))"),
    ),
    (DEEP, _syntax(18 + 13 * 32, "'Best'", "a selector nested at most 32 deep in among=", DEEP)),
    (
        "latest => Average(Last(2), weights=x)",
        _syntax(
            27, "'weights'", "state=best or state=latest", "latest => Average(Last(2), weights=x)"
        ),
    ),
    (
        "latest => best extra",
        _syntax(15, "'extra'", "the end of the source", "latest => best extra"),
    ),
    (
        "best => latest",
        _syntax(0, "'best'", "a run: latest, all, a run id or a quoted run id", "best => latest"),
    ),
    (
        "latest => Last(3)",
        _syntax(10, "'Last'", "best, latest or Average(...)", "latest => Last(3)"),
    ),
    (
        "latest => Average(Best(2; among=Best(1; among=Last(x))))",
        _syntax(
            51,
            "'x'",
            "a positive integer",
            "latest => Average(Best(2; among=Best(1; among=Last(x))))",
        ),
    ),
    (
        "latest => best; rm -rf /",
        _syntax(14, "';'", "the end of the source", "latest => best; rm -rf /"),
    ),
    ("latest\x00 => best", _syntax(6, "'\\x00'", "'=>'", "latest\x00 => best")),
    ("latest => Average(Last(1.5))", _syntax(24, "'.'", "')'", "latest => Average(Last(1.5))")),
    ("", _syntax(0, "the end of the text", "a run: latest, all, a run id or a quoted run id", "")),
    ("all", _syntax(3, "the end of the text", "'=>'", "all")),
    ("runs/my run/epoch-3", _syntax(4, "'/'", "'=>'", "runs/my run/epoch-3")),
    (
        '"" => best',
        "Cannot parse source '\"\" => best': at position 0 found an empty quoted run id, "
        "expected a run: latest, all, a run id or a quoted run id. Write the run's id, e.g. "
        "'a1b2c3d4 => best' (nitro runs lists them), or 'latest => best' (the latest run's best).",
    ),
    (
        "  '' => Average(Last(2))",
        "Cannot parse source \"  '' => Average(Last(2))\": at position 2 found an empty quoted run "
        "id, expected a run: latest, all, a run id or a quoted run id. Write the run's id, e.g. "
        "'a1b2c3d4 => best' (nitro runs lists them), or 'latest => best' (the latest run's best).",
    ),
]


@pytest.mark.parametrize(("text", "message"), REJECTED)
def test_rejected_sources_name_position_found_and_expected(text, message):
    with pytest.raises(SourceSyntaxError) as exc:
        parse_source(text)
    if message is not None:
        assert str(exc.value) == message
    assert isinstance(exc.value, ValueError)


def test_a_100_kb_source_is_refused_by_length():
    with pytest.raises(SourceSyntaxError) as exc:
        parse_source("latest => " + "x" * 100_000)
    assert str(exc.value) == (
        "Source is 100010 characters long; the limit is 512. Write a pair such as 'latest => best' "
        "or a record's path (a .safetensors file or a record directory)."
    )


@settings(max_examples=400, deadline=200)
@given(st.text(max_size=200))
def test_any_text_parses_or_raises_source_syntax_error(text):
    try:
        result = parse_source(text)
    except SourceSyntaxError:
        return
    assert isinstance(result, Pair | PathSource)


GRAMMAR_ALPHABET = st.sampled_from(
    ["latest", "all", "best", "=>", "Average", "(", ")", "Best", "Last", "Every", "Epochs", "among", "=",
     ";", ",", "[", "]", ":", "3", "7", "state", " ", "a1b2", '"', ":best"]
)  # fmt: skip


@settings(max_examples=400, deadline=200)
@given(st.lists(GRAMMAR_ALPHABET, max_size=30).map("".join))
def test_near_grammatical_text_parses_or_raises_source_syntax_error(text):
    try:
        parse_source(text)
    except SourceSyntaxError:
        pass


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (("latest", "best"), Pair(LATEST, "best")),
        (("a1b2c3d4", Average(Last(10))), Pair(RunRef("id", "a1b2c3d4"), Average(Last(10)))),
        ((":all", "best"), Pair(ALL, "best")),
        (("my run", "latest"), Pair(RunRef("id", "my run"), "latest")),
    ],
)
def test_python_forms_become_the_same_structures(value, expected):
    assert to_source(value) == expected


def test_python_form_that_is_not_a_source_is_refused():
    with pytest.raises(ConfigError) as exc:
        to_source(42, "weights")
    assert str(exc.value) == (
        "weights=42 is not a source; write a string such as 'latest => best', a tuple such as "
        "('latest', Average(Last(10))), or a path to a .safetensors file."
    )


def test_parse_average_alone_for_restore_best():
    assert parse_average("Average(Last(10))") == Average(Last(10))
    with pytest.raises(SourceSyntaxError):
        parse_average("Average(Last(10)) + 1")


def test_sources_print_back_in_the_grammar():
    for text in (
        "latest => best",
        "a1b2 => Average(Best(5; among=Last(20)))",
        "latest => Average(Epochs(3:7), state=best)",
        "latest => Average(Epochs(3:3))",
        "latest => Average(Epochs([4, 2]))",
    ):
        assert str(parse_source(text)) == text


ROUND_TRIP = [  # source -> its canonical text, which parses back to the same structure
    ('"my run" => best', '"my run" => best'),
    ("'my run' => best", '"my run" => best'),
    ("""'say "hi"' => latest""", """'say "hi"' => latest"""),
    (""""it's" => best""", """"it's" => best"""),
    ('"back\\slash" => best', '"back\\slash" => best'),
    ('"ends in \\" => latest', '"ends in \\" => latest'),
    ('"  padded  " => best', '"  padded  " => best'),
    ('"tab\there" => best', '"tab\there" => best'),
    ('"latest" => best', '"latest" => best'),  # a run whose id is a keyword
    ('"all" => latest', '"all" => latest'),
    ('"Average" => Average(Last(3))', '"Average" => Average(Last(3))'),
    ('":abc" => best', '":abc" => best'),  # bare, the colon would be read as a symbol's
    ('"-x" => best', '"-x" => best'),
    ('"a=>b" => best', '"a=>b" => best'),
    ('"a1b2c3d4" => latest', "a1b2c3d4 => latest"),
    ("007 => best", "007 => best"),
    (":latest => :best", "latest => best"),
    ('"my run" => Average(Last(2), state=latest)', '"my run" => Average(Last(2), state=latest)'),
    ("latest => Average(Best(5, among=Last(20)))", "latest => Average(Best(5; among=Last(20)))"),
    ("latest=>Average(Epochs( 3 : 7 ),state=:best)", "latest => Average(Epochs(3:7), state=best)"),
    ("a1 => Average(Epochs([4,2]))", "a1 => Average(Epochs([4, 2]))"),
    ("latest => Average(Every(2))", "latest => Average(Every(2))"),
    ("runs/x/epoch-0003-step-15-loss=0.08", "runs/x/epoch-0003-step-15-loss=0.08"),
    ("runs/x/epoch-0003-step-15-loss=0.08/", "runs/x/epoch-0003-step-15-loss=0.08/"),
    (" /abs/avg 10.safetensors ", "/abs/avg 10.safetensors"),
]


@pytest.mark.parametrize(("text", "canonical"), ROUND_TRIP)
def test_a_sources_canonical_text_parses_back_to_the_same_structure(text, canonical):
    parsed = parse_source(text)
    assert str(parsed) == canonical
    assert parse_source(canonical) == parsed


RUN_ID = st.text(st.sampled_from(list("ab1_- :'\"\\=>()latestvgAl\t")), min_size=1, max_size=12)
PICK = st.sampled_from(
    ["best", "latest", Average(Last(3)), Average(Best(2, among=Last(4)), state="latest")]
)


@settings(max_examples=300, deadline=200)
@given(RUN_ID.filter(lambda r: not ("'" in r and '"' in r)), PICK)
def test_any_run_id_prints_in_a_form_that_parses_back_to_it(run, pick):
    source = Pair(RunRef("id", run), pick)
    assert parse_source(str(source)) == source
    if run.lstrip(":") not in ("latest", "all"):  # in a tuple these are the keywords
        assert to_source((run, pick)) == source


def test_a_run_id_holding_both_quotes_cannot_be_written_and_says_what_to_do():
    with pytest.raises(ConfigError) as exc:
        to_source(("""it's "x\"""", "best"))
    assert str(exc.value) == (
        """Run id 'it\\'s "x"' holds both quote characters, so no source can name it (a quoted """
        "run id has no escapes); name its records by path, or 'latest => best' when it wrote last."
    )
