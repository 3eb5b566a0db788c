"""Output piped or redirected (issue 35): what the terminal views emit, as rich renders it, with colour forced or
off, in 16 colours; spinners and bars on stderr, drawn once off a terminal; the side-by-side page's Arabic and
title."""

import io
import re
import sys
import time

import pytest
from rich.console import Console
from rich.progress import track

from llmattr import display, render
from test_views import TOKENS, synthetic

SIGNED = [[-2.0, 2.0, 0.0, 1.0, -1.0, 0.1, 0.0]]  # " An" most negative, " engross" most positive


class Terminal(io.StringIO):
    """A file that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def rendered(expl, file=None, **console) -> str:
    file = file if file is not None else io.StringIO()
    render.print_explanation(expl, Console(file=file, width=80, **console))
    return file.getvalue()


def background_of(out: str, token: str) -> set[str]:
    """The SGR codes of the style ``token`` is printed in."""
    return set(re.search(r"\x1b\[([0-9;]+)m" + re.escape(token), out).group(1).split(";"))


def test_sixteen_colour_terminal_keeps_blue_for_negative_and_red_for_positive():
    # TERM=xterm with colour forced: rich detects 16 colours; the heatmap picks its own blues and reds
    out = rendered(synthetic(SIGNED), Terminal(), force_terminal=True, _environ={"TERM": "xterm"})
    assert background_of(out, " An") == {"97", "44"}  # -max: bright white on blue
    assert background_of(out, " engross") == {"97", "41"}  # +max: bright white on red
    assert background_of(out, " never") == {"30", "104"} and background_of(out, " film") == {"30", "101"}  # half
    assert background_of(out, "ing") == {"30", "107"}  # zero: white


def test_truecolor_override_keeps_the_rgb_ramp():
    out = rendered(synthetic(SIGNED), Terminal(), force_terminal=True,
                   _environ={"TERM": "xterm", "COLORTERM": "truecolor"})  # docs/cli.md's override
    assert "48;2;31;119;180m An" in out and "48;2;214;39;40m engross" in out


def test_numbers_are_printed_where_colour_is_not_seen():
    values = r"\[-?[0-9.e+-]+\]"
    expl = synthetic(SIGNED)
    assert not re.search(values, rendered(expl, Terminal(), force_terminal=True))  # a coloured terminal
    assert len(re.findall(values, rendered(expl, Terminal(), force_terminal=True, no_color=True))) == len(TOKENS)
    # colour forced into a file (FORCE_COLOR=1 ... > o.txt): coloured, and the values are there too
    forced = rendered(expl, force_terminal=True)
    assert "\x1b[" in forced and len(re.findall(values, forced)) == len(TOKENS)


def test_sub_word_tokens_are_not_split_by_a_space_after_their_number():
    out = rendered(synthetic(SIGNED), force_terminal=False)
    assert "engross[2.00]ing[0.00] film[1.00]" in out and " An[-2.00] engross" in out
    assert display.continues_word("engross", "ing") and not display.continues_word("a", " b")
    assert not display.continues_word("这", "部")  # a CJK character is a word of its own
    assert display.continues_word("\u0647\u0630", "\u0627") and display.continues_word("e", "\u0301")


def test_header_lines_do_not_wrap_at_80_columns():
    expl = synthetic(SIGNED)
    expl.generated = "a long answer that goes on and on, well past the eighty columns of a piped output, to its end"
    lines = rendered(expl, force_terminal=False).splitlines()
    assert lines[0].startswith("model ") and lines[0].endswith(repr(expl.generated))
    assert lines[1].startswith("scale raw score") and lines[1].endswith("red 2.00")


def test_progress_and_spinners_off_a_terminal_are_drawn_once_on_stderr(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    err, out = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    console = render.progress_console()
    with console.status("loading model ..."):
        time.sleep(0.3)  # a live spinner would draw several frames meanwhile
    assert list(track(range(3), description="explaining", console=render.progress_console())) == [0, 1, 2]
    assert out.getvalue() == "" and "loading model" not in err.getvalue()
    assert err.getvalue().count("explaining") == 1 and "\r" not in err.getvalue()


def test_arabic_keeps_its_joined_forms_in_the_grid(tmp_path):
    pieces = ["\u0647\u0630", "\u0627", " \u0627\u0644", "\u0641\u064a\u0644\u0645", " \u0631", "\u0627\u0626\u0639"]
    cells = display.joined_cells(pieces)
    # haa-dhal | alef: dhal joins nothing after it; alif-lam | feh: joined; reh | alef: reh joins nothing after it
    assert cells[0] == pieces[0] and cells[2] == pieces[2] + display.ZWJ and cells[3] == display.ZWJ + pieces[3]
    assert cells[4] == pieces[4] and cells[5] == pieces[5]
    expl = synthetic([[0.5, -0.5, 0.2, 0.1, 0.0, 0.3]], text="".join(pieces))
    expl.tokens = pieces
    page = render.grid_page([expl])
    heads = re.findall(r'<th class="c">([^<]*)</th>', page)
    assert heads[2].endswith(display.ZWJ) and heads[3].startswith(display.ZWJ)


@pytest.mark.parametrize(("methods", "texts", "title"), [
    (["saliency"], ["a", "b"], "saliency on 2 texts"),
    (["saliency", "random"], ["a"], "saliency, random side by side"),
    (["saliency", "random"], ["a", "b"], "saliency, random side by side on 2 texts"),
])
def test_grid_page_title_says_side_by_side_only_for_several_methods(methods, texts, title):
    expls = []
    for text in texts:
        for method in methods:
            expl = synthetic(SIGNED, method=method, text=text)
            expls.append(expl)
    assert f"<title>llmattr: {title}</title>" in render.grid_page(expls)
