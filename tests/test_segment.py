"""``segment`` on real documents (licences, FAQs, man pages, READMEs, pydoc topics): numbers,
markers and headings join the text they label, list items, tables and code stay whole,
prose still splits into Bling Fire's sentences, and every non-space character of the text
is in exactly one unit whose span reproduces it. Excerpts are copied here; the whole files
(masklab/data/realdocs/docs, /usr/share/common-licenses/Apache-2.0) are read when present."""

import importlib.util
from pathlib import Path

import blingfire
import pytest

import masklab
from masklab.text.document import segment, word_offsets

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("segment_counts", ROOT / "scripts" / "segment_counts.py")
_counts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_counts)
is_label = _counts.is_label  # a unit of <= 3 tokens that is only a number, marker or heading

APACHE = """                                 Apache License
                           Version 2.0, January 2004
                        http://www.apache.org/licenses/

   TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION

   1. Definitions.

      "License" shall mean the terms and conditions for use, reproduction,
      and distribution as defined by Sections 1 through 9 of this document.

      "Licensor" shall mean the copyright owner or entity authorized by
      the copyright owner that is granting the License.

   6. Trademarks. This License does not grant permission to use the trade
      names, trademarks, service marks, or product names of the Licensor,
      except as required for reasonable and customary use in describing the
      origin of the Work and reproducing the content of the NOTICE file.

   7. Disclaimer of Warranty. Unless required by applicable law or
      agreed to in writing, Licensor provides the Work (and each
      Contributor provides its Contributions) on an "AS IS" BASIS,
      WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or
      implied, including, without limitation, any warranties or conditions
      of TITLE, NON-INFRINGEMENT, MERCHANTABILITY, or FITNESS FOR A
      PARTICULAR PURPOSE. You are solely responsible for determining the
      appropriateness of using or redistributing the Work and assume any
      risks associated with Your exercise of permissions under this License.

   END OF TERMS AND CONDITIONS
"""

FAQ = """Frequently Asked Questions about base-files
===========================================

* Questions about /etc/issue and /etc/debian_version:

Q. I upgraded my system to the testing distribution and now my /etc/issue
says "trixie/sid". Should it not read "trixie" or "testing"?

A. That would be nice, but it is not possible because of the way the
testing distribution works. Packages uploaded for unstable reach
testing after ten days, provided they are built for every released
architecture, have no RC-bugs and their dependencies are satisfied in testing.
You should consider the testing and unstable distributions as
two sides of the same coin.

Q: Why "trixie/sid" and not "testing/unstable" as it used to be?

A: The codename is a little bit more informative.
"""

MAN = """XARGS(1)                    General Commands Manual                   XARGS(1)

NAME
       xargs - build and execute command lines from standard input

DESCRIPTION
       This manual page documents the GNU version of xargs.  xargs reads items
       from the standard input, delimited by blanks or newlines.

OPTIONS

       -0, --null
              Input  items  are  terminated by a null character instead of by
              whitespace.

       --debug

              annotate program execution

EXIT STATUS
       xargs exits with the following status:
"""

MARKDOWN = """# zstd

Zstandard is a fast lossless compression algorithm.

## Build instructions

### Makefile

If your system is compatible with a standard `make` (or `gmake`) binary generator,
you can simply run it at the root directory.

1. Create the dictionary

```
zstd --train FullPathToTrainingSet/* -o dictionaryName

zstd -D dictionaryName FILE. Then more.
```

| Compressor name | Ratio | Compression |
| --- | --- | --- |
| zstd 1.5.1 -1   | 2.887 |   530 MB/s  |
| brotli 1.0.9 -0 | 2.702 |   395 MB/s  |

- Bug fixes.
- New function mpfr_cmpabs_ui.
- Improved MPFR manual.
"""

REST = """The "try" statement
*******************

The "try" statement specifies exception handlers. When an exception has been
assigned using "as target", it is cleared at the end of the "except" clause.  This is as if

   except E as N:
       foo

was translated to

   except E as N:
       try:
           foo
       finally:
           del N

This means the exception must be assigned to a different name.

"except" clause
===============

The "except" clause(s) specify one or more exception handlers.

See also:

* comments,

* blank lines, and

* other future statements.
"""

PROSE = """The meeting opened at seven in the evening with eight members present. \
The chair welcomed two new volunteers who will run the children's reading hour. \
A long discussion followed about the leaking roof above the periodicals room; \
a contractor will be asked for a second quote.

The treasurer, Margaret Okafor, presented the accounts for the winter quarter.
Donations were slightly lower than last year, while the book sale raised more than
expected. After some debate, the annual budget was approved by Daniel Reyes, the board
president, on behalf of the members.
"""

CASES = {"apache": APACHE, "faq": FAQ, "man": MAN, "markdown": MARKDOWN, "rest": REST, "prose": PROSE}

REALDOCS = Path(masklab.__file__).parent / "data" / "realdocs" / "docs"
REAL_NAMES = [
    "apache-2.0",
    "gpl-3",
    "mpl-2.0",
    "procps-faq",
    "base-files-faq",
    "man-db-faq",
    "xargs-man",
    "gzip-man",
    "sed-man",
    "zstd-readme",
    "pydoc-try",
    "pydoc-import",
]


def check_invariants(text, doc):
    """Spans reproduce the units, units are trimmed and not empty, in reading order, and
    every non-space character of the text is in exactly one unit."""
    owner = [0] * len(text)
    last = 0
    for unit, (a, b) in zip(doc.units, doc.spans, strict=True):
        assert unit and unit == unit.strip() and text[a:b] == unit
        assert a >= last
        last = b
        for i in range(a, b):
            owner[i] += 1
    missing = [i for i, c in enumerate(text) if not c.isspace() and owner[i] != 1]
    assert not missing, f"characters in no unit: {text[missing[0] : missing[0] + 40]!r}"


def unit_with(doc, needle):
    return next(u for u in doc.units if needle in u)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_label_stands_alone_and_spans_cover_the_text(name):
    doc = segment(CASES[name])
    check_invariants(CASES[name], doc)
    assert [u for u in doc.units if is_label(u)] == []


def test_is_label_tells_markers_and_headings_from_short_sentences():
    assert all(
        map(
            is_label,
            [
                "2.",
                "1)",
                "Q.",
                "A:",
                "(a)",
                "-",
                "*",
                "Definitions.",
                "## Install",
                "DESCRIPTION",
                "TERMS AND CONDITIONS",
                "Preamble",
                "Then",
            ],
        )
    )
    assert not any(map(is_label, ["Is this ok?", "A. Yes.", "It works.", "Implies -x."]))


def test_numbers_and_titles_join_their_clause():
    doc = segment(APACHE)
    assert unit_with(doc, "Trademarks").startswith("6. Trademarks. This License does not grant")
    assert unit_with(doc, "Disclaimer").startswith("7. Disclaimer of Warranty. Unless required")
    # a numbered title alone on its line leads the paragraph below it
    assert unit_with(doc, "Definitions").startswith(
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION\n\n"
        '   1. Definitions.\n\n      "License" shall mean'
    )
    # a heading with no text after it ends the unit before it
    assert doc.units[-1].endswith("under this License.\n\n   END OF TERMS AND CONDITIONS")


def test_faq_markers_join_their_question_and_answer():
    doc = segment(FAQ)
    q = unit_with(doc, "I upgraded my system")
    assert q.startswith("Frequently Asked Questions about base-files\n===")  # the headings lead it
    assert q.endswith(
        "Q. I upgraded my system to the testing distribution and now my /etc/issue\n"
        'says "trixie/sid". Should it not read "trixie" or "testing"?'
    )
    assert unit_with(doc, "That would be nice").startswith("A. That would be nice")
    assert unit_with(doc, 'Why "trixie/sid"') == 'Q: Why "trixie/sid" and not "testing/unstable" as it used to be?'
    assert "A: The codename is a little bit more informative." in doc.units


def test_man_page_section_names_and_options_lead_their_text():
    doc = segment(MAN)
    assert unit_with(doc, "build and execute").startswith("XARGS(1)")
    assert unit_with(doc, "documents the GNU version").startswith("DESCRIPTION\n")
    assert unit_with(doc, "Input  items").startswith("OPTIONS\n\n       -0, --null\n")
    assert unit_with(doc, "annotate program execution") == "--debug\n\n              annotate program execution"
    assert doc.units[-1] == "EXIT STATUS\n       xargs exits with the following status:"


def test_markdown_headings_lists_tables_and_fenced_code():
    doc = segment(MARKDOWN)
    assert doc.units[0] == "# zstd\n\nZstandard is a fast lossless compression algorithm."
    assert unit_with(doc, "If your system").startswith("## Build instructions\n\n### Makefile\n\nIf your system")
    fence = MARKDOWN[MARKDOWN.index("```") : MARKDOWN.rindex("```") + 3]
    assert unit_with(doc, "zstd --train") == "1. Create the dictionary\n\n" + fence  # whole, blank line and all
    table = MARKDOWN[MARKDOWN.index("| Compressor") : MARKDOWN.index("395 MB/s  |") + 11]
    assert table in doc.units
    assert "- Bug fixes.\n- New function mpfr_cmpabs_ui.\n- Improved MPFR manual." in doc.units


def test_rest_titles_and_indented_code_blocks():
    doc = segment(REST)
    assert unit_with(doc, "specifies exception handlers").startswith(
        'The "try" statement\n*******************\n\nThe "try"'
    )
    code = "except E as N:\n       try:\n           foo\n       finally:\n           del N"
    assert unit_with(doc, "finally:") == "was translated to\n\n   " + code
    assert unit_with(doc, "       foo").startswith("This is as if\n\n   except E as N:")
    assert unit_with(doc, "one or more").startswith('"except" clause\n===============\n\nThe "except"')
    assert unit_with(doc, "comments,") == "See also:\n\n* comments,"


def test_long_lists_and_code_are_cut_at_items_and_lines():
    items = "\n".join(f"- item number {i} has a few words in it." for i in range(30))
    doc = segment(items, unit_tokens=40)
    check_invariants(items, doc)
    assert len(doc.units) > 3 and all(len(word_offsets(u)) <= 40 for u in doc.units)
    assert all(u.startswith("- item") and u.endswith("in it.") for u in doc.units)  # whole items
    code = "Example:\n\n" + "\n".join(f"    value_{i} = compute(x_{i}, y_{i}). Then z_{i}" for i in range(30))
    doc = segment(code, unit_tokens=40)
    check_invariants(code, doc)
    assert all(u.endswith(tuple(f"z_{i}" for i in range(30))) for u in doc.units)  # cut at line ends only
    assert doc.units[0].startswith("Example:\n\n    value_0")


def test_prose_still_splits_into_blingfire_sentences():
    doc = segment(PROSE)
    expected = []
    for para in PROSE.split("\n\n"):
        expected += [s.strip() for s in blingfire.text_to_sentences(para.strip()).split("\n")]
    assert [" ".join(u.split()) for u in doc.units] == expected
    assert doc.text_of([0, 3]) == doc.units[0] + "\n\n" + doc.units[3]  # the paragraph break is kept


def test_a_heading_alone_is_one_unit():
    assert segment("## Install\n").units == ["## Install"]
    assert segment("Install\n=======\n").units == ["Install\n======="]


def _real(name):
    path = REALDOCS / f"{name}.txt"
    if not path.is_file():
        pytest.skip(f"{path} is not there (masklab/data/realdocs is written separately)")
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_documents_have_no_labels_alone(name):
    text = _real(name)
    doc = segment(text)
    check_invariants(text, doc)
    assert [u for u in doc.units if is_label(u)] == []


def test_apache_license_from_the_system():
    path = Path("/usr/share/common-licenses/Apache-2.0")
    if not path.is_file():
        pytest.skip("no /usr/share/common-licenses/Apache-2.0 here")
    text = path.read_text(encoding="utf-8")
    doc = segment(text)
    check_invariants(text, doc)
    assert [u for u in doc.units if is_label(u)] == []
    assert unit_with(doc, "Grant of Copyright License").startswith("2. Grant of Copyright License. Subject to")
    i = doc.units.index(unit_with(doc, "6. Trademarks."))
    assert doc.units[i + 1].startswith("7. Disclaimer of Warranty.")
    assert doc.text_of([i, i + 1]) == text[doc.spans[i][0] : doc.spans[i + 1][1]]  # neighbours keep their source text


def test_a_short_lower_case_tail_cut_after_a_quotation_ends_its_sentence():
    item = (
        "- Bug fixes. In particular: a speed improvement when the --enable-assert\n"
        "  or --enable-assert=full configure option is used with GCC; mpfr_get_str\n"
        "  now sets the NaN flag on NaN input and the inexact flag when the conversion\n"
        "  is inexact. For a full list, see https://www.mpfr.org/mpfr-3.1.6/#fixed\n"
        "  and the same section for any previous 3.1.x version (follow the links\n"
        '  in the "Changes..." sections).\n'
    )
    units = segment(item + "- Microsoft Windows: Added support for thread-safe DLL (shared library).\n").units
    assert not any(u.strip() == "sections)." for u in units)
    assert any(u.endswith('"Changes..." sections).') for u in units)
