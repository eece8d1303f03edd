"""MkDocs hook: a docs page includes a distribution's README with the line

    <!-- readme: quax-lora/README.md -->

so that the facts a README gives (install, first example, what it covers, limits) have
one source. A family's page (`docs/families/<name>.md`) opens with its README and holds
the depth after it: the full guide, every benchmark table and their history.

The README's links are rewritten from the repository's layout to the site's: the root
README becomes the home page, `docs/images/` the site's `images/`, a link to the page
that includes the README a link within that page (`#anchor`), and any other relative
link a link to the file in the repository's tree is left as text. A part of the README
between `<!-- readme-only -->` and `<!-- /readme-only -->` (its pointer to the page
that includes it) is left out.
"""

import pathlib
import re


ROOT = pathlib.Path(__file__).resolve().parent.parent
_MARKER = re.compile(r"^<!-- readme: (?P<path>[\w./-]+) -->$", re.MULTILINE)
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_README_ONLY = re.compile(
    r"^<!-- readme-only -->\n.*?^<!-- /readme-only -->\n", re.MULTILINE | re.DOTALL
)


def _rewrite(readme: str, page: str) -> str:
    """`readme`'s links as seen from the docs page `page` (relative to `docs/`)."""
    up = "../" * page.count("/")

    def link(m: re.Match[str]) -> str:
        target = m["target"]
        if "://" in target or target.startswith("#"):
            return m[0]
        if target == "../README.md":
            return f"{m['bang']}[{m['text']}]({up}index.md)"
        if target.startswith("../docs/"):
            path, _, anchor = target.removeprefix("../docs/").partition("#")
            if path == page:  # the including page itself
                return f"{m['bang']}[{m['text']}](#{anchor})"
            return f"{m['bang']}[{m['text']}]({up}{target.removeprefix('../docs/')})"
        # A file of the repository outside the docs: name it, without a link.
        return f"{m['text']} (`{target.removeprefix('../')}`)"

    return _LINK.sub(link, readme)


def on_page_markdown(markdown, page, config, files):
    def include(m: re.Match[str]) -> str:
        text = (ROOT / m["path"]).read_text(encoding="utf-8")
        # The page has its own title: the README's first heading is dropped.
        text = re.sub(r"\A# .*\n", "", text)
        text = _README_ONLY.sub("", text)
        return _rewrite(text, page.file.src_uri)

    return _MARKER.sub(include, markdown)
