"""The one way the benchmark scripts rewrite their own part of ``benchmarks/README.md``."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


def replace_section(begin: str, end: str, body: str, heading: str, readme: Path = README) -> None:
    """Put ``body`` between the ``begin``/``end`` markers, leaving the rest of the file as
    it is; without the markers, append them under a new ``## heading``."""
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    block = f"{begin}\n{body.strip(chr(10))}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n" + block + "\n"
    readme.write_text(text)
