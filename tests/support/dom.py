"""A small HTML tree for tests that read rendered pages (in memory or dumped by Chromium)."""

from __future__ import annotations

from html.parser import HTMLParser


class Element:
    """One element of a parsed page: tag, attributes, and its content (elements and text)."""

    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag = tag
        self.attrs = attrs
        self.content: list[Element | str] = []

    @property
    def children(self) -> list[Element]:
        """The child elements."""
        return [c for c in self.content if isinstance(c, Element)]

    def all(self, tag: str | None = None, **attrs: str) -> list[Element]:
        """Descendants with ``tag`` whose attributes contain ``attrs`` (class by word)."""
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and all(
                value in child.attrs.get(key.rstrip("_"), "").split()
                if key == "class_"
                else child.attrs.get(key) == value
                for key, value in attrs.items()
            ):
                found.append(child)
            found.extend(child.all(tag, **attrs))
        return found

    def textContent(self) -> str:
        """All the text inside, in document order, whitespace collapsed."""
        parts = [c if isinstance(c, str) else c.textContent() for c in self.content]
        return " ".join(" ".join(parts).split())


_VOID = {"meta", "link", "br", "img", "input", "hr", "line", "rect", "polyline"}


class _TreeBuilder(HTMLParser):
    """Builds an ``Element`` tree (enough of HTML for the page Chromium serialized)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].content.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].content.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].content.append(data)


def parseDom(html: str) -> Element:
    """The element tree of ``html``."""
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root
