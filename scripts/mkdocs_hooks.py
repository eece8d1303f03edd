"""MkDocs hook: a docs page includes a distribution's README with the line

    <!-- readme: quax-lora/README.md -->

so that a family's facts (feature table, benchmark figures, limits) have one source.
The README's links are rewritten from the repository's layout to the site's: the root
README becomes the home page, `docs/images/` the site's `images/`, and any other
relative link a link to the file in the repository's tree is left as text.
"""

import pathlib
import re


ROOT = pathlib.Path(__file__).resolve().parent.parent
_MARKER = re.compile(r"^<!-- readme: (?P<path>[\w./-]+) -->$", re.MULTILINE)
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")


def _rewrite(readme: str, page_depth: int) -> str:
    up = "../" * page_depth

    def link(m: re.Match[str]) -> str:
        target = m["target"]
        if "://" in target or target.startswith("#"):
            return m[0]
        if target == "../README.md":
            return f"{m['bang']}[{m['text']}]({up}index.md)"
        if target.startswith("../docs/"):
            return f"{m['bang']}[{m['text']}]({up}{target.removeprefix('../docs/')})"
        # A file of the repository outside the docs: name it, without a link.
        return f"{m['text']} (`{target.removeprefix('../')}`)"

    return _LINK.sub(link, readme)


def on_page_markdown(markdown, page, config, files):
    depth = page.file.src_uri.count("/")

    def include(m: re.Match[str]) -> str:
        text = (ROOT / m["path"]).read_text(encoding="utf-8")
        # The page has its own title: the README's first heading is dropped.
        text = re.sub(r"\A# .*\n", "", text)
        return _rewrite(text, depth)

    return _MARKER.sub(include, markdown)
