"""WebShop's pages as data (`Page`, a sequence of `Element`) and their three renderings: text, rich text, HTML.

A page is the ordered list of visible text nodes of the original's HTML page, each tagged with what it is (plain
text, a button, a product link, an option value). One page model feeds every rendering, so the agent's text, the
rich text and the HTML a human sees in the browser always show the same page.

* ``text``: the nodes joined by `` [SEP] `` (the original's "simple" text mode).
* ``text_rich``: one node per line; buttons as ``[button] X [button_]``; chosen option values as
  ``[clicked button] X [clicked button_]`` with "You have clicked X." lines prepended; product links on their own
  line, ``[clicked button]`` once visited in this episode.
* HTML: a plain page whose buttons post the equivalent ``click[...]`` action (see `server`).

The done page carries what the original's text mode reads out of its done page, hidden debug block included
(MTurk code "None", the purchased ASIN and options as JSON, empty goal fields, the score), so its text is the
original's word for word.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Element",
    "Page",
    "done_page",
    "item_page",
    "render_html",
    "render_text",
    "render_text_rich",
    "results_page",
    "start_page",
    "sub_page",
]

RESULTS_PER_PAGE = 10
SUB_PAGES = ("description", "features", "reviews")
Kind = Literal["text", "button", "link", "option", "search"]


@dataclass(frozen=True)
class Element:
    """One visible text node of a page.

    Attributes:
        text: the text shown.
        kind: "text" (not clickable), "button", "link" (a product ASIN), "option" (an option value) or "search"
            (the search button; searching is done with ``search[...]``, never by clicking it).
        selected: an option value currently chosen, or a product link already visited.
        group: the option name, for option values.
        hidden: in the page's text but not shown to people (the original's ``display:none`` debug block, which its
            text modes read out all the same).
    """

    text: str
    kind: Kind = "text"
    selected: bool = False
    group: str = ""
    hidden: bool = False

    @property
    def key(self) -> str:
        """What ``click[...]`` must name to press it: the lowercased text."""
        return self.text.lower()


@dataclass(frozen=True)
class Page:
    """A rendered page: its name ("start", "results", "item", "description", "features", "reviews", "done")."""

    name: str
    elements: tuple[Element, ...]

    def clickables(self) -> dict[str, Element]:
        """Click key -> element, for every clickable element (a later duplicate wins, as in the original)."""
        return {e.key: e for e in self.elements if e.kind in ("button", "link", "option")}


def _header(instruction: str) -> list[Element]:
    return [Element("Instruction:"), Element(instruction)]


def start_page(instruction: str) -> Page:
    """The search page an episode starts on."""
    return Page("start", (Element("WebShop"), *_header(instruction), Element("Search", "search")))


def results_page(
    instruction: str, page: int, total: int, products: Sequence[Mapping[str, Any]], visited: frozenset[str]
) -> Page:
    """One page of search results: navigation, then ASIN, title and price of up to 10 products."""
    elements = [*_header(instruction), Element("Back to Search", "button"),
                Element(f"Page {page} (Total results: {total})")]
    if page > 1:
        elements.append(Element("< Prev", "button"))
    # The original always shows "Next >", even on the last page (clicking it there shows an empty page).
    elements.append(Element("Next >", "button"))
    for product in products:
        elements += [Element(product["asin"], "link", selected=product["asin"] in visited),
                     Element(product["Title"]), Element(product["Price"])]
    return Page("results", tuple(elements))


def item_page(instruction: str, product: Mapping[str, Any], chosen: Mapping[str, str]) -> Page:
    """A product page: its option values by option name, title, price, rating and the sub-page and buy buttons."""
    elements = [*_header(instruction), Element("Back to Search", "button"), Element("< Prev", "button")]
    for name, values in product["options"].items():
        elements.append(Element(name))
        elements += [Element(v, "option", selected=chosen.get(name) == v, group=name) for v in values]
    elements += [Element(product["Title"]), Element(f"Price: {product['Price']}"),
                 Element(f"Rating: {product['Rating']}"), Element("Description", "button"),
                 Element("Features", "button"), Element("Reviews", "button"), Element("Buy Now", "button")]
    return Page("item", tuple(elements))


def sub_page(instruction: str, product: Mapping[str, Any], which: str) -> Page:
    """The description, features (bullet points) or reviews of a product."""
    if which not in SUB_PAGES:
        raise ValueError(f"webshop: unknown sub-page {which!r}; expected one of {SUB_PAGES}")
    elements = [*_header(instruction), Element("Back to Search", "button"), Element("< Prev", "button")]
    if which == "description":
        body = [product["Description"]]
    elif which == "features":
        body = list(product["BulletPoints"])
    else:
        body = [str(part) for r in product["Reviews"] for part in (r.get("title", ""), r.get("score", ""),
                                                                    r.get("body", ""))]
    elements += [Element(t) for t in body if str(t).strip()]
    return Page(which, tuple(elements))


def _options_json(options: Mapping[str, str]) -> str:
    # Flask's ``tojson`` filter: sorted keys, ASCII escapes, and <, >, &, ' escaped for HTML.
    text = json.dumps(dict(options), sort_keys=True)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(char, escape)
    return text


def done_page(reward: float, asin: str, options: Mapping[str, str]) -> Page:
    """The page after buying: the original's done page as its text mode reads it (see the module docstring)."""
    shown = [Element("Thank you for shopping with us!"), Element("Your code:"), Element("None"),
             Element("(Paste it in your MTurk interface.)")]
    # "instuction" is the original's spelling.
    debug = ["Purchased", "asin", asin, "options", _options_json(options), "attrs", "None", "category", "None",
             "query", "None", "product category", "None", "Target", "asin", "options", "attrs", "price upper",
             "instuction text", "category", "product category", "query", "Goal", "None", "Reward"]
    score = [Element("Your score (min 0.0, max 1.0)"), Element(str(float(reward)))]
    details = [Element("Reward Details", hidden=True), Element("None", hidden=True)]
    return Page("done", (*shown, *(Element(t, hidden=True) for t in debug), *score, *details))


def render_text(page: Page) -> str:
    """The original's ``text`` observation: visible text nodes joined by `` [SEP] ``."""
    return " [SEP] ".join(e.text.strip() for e in page.elements if e.text.strip())


def render_text_rich(page: Page) -> str:
    """The original's ``text_rich`` observation (see the module docstring)."""
    lines = ""
    prefix = ""
    for e in page.elements:
        if e.kind in ("button", "search"):
            piece = f"[button] {e.text} [button_]"
        elif e.kind == "option":
            if e.selected:
                piece = f"  [clicked button] {e.text} [clicked button_]"
                prefix = f"You have clicked {e.text}.\n" + prefix
            else:
                piece = f"  [button] {e.text} [button_]"
        elif e.kind == "link":
            marker = "clicked button" if e.selected else "button"
            piece = f"\n[{marker}] {e.text} [{marker}_]"
        else:
            piece = e.text
        lines += piece + "\n"
    return prefix + lines


_CSS = """
body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222}
button{margin:.2em;padding:.35em .8em;border-radius:4px;border:1px solid #888;background:#f4f4f4;cursor:pointer}
button.buy{background:#f0a400;font-weight:bold}
button.product-link{border:none;background:none;color:#06c;text-decoration:underline;font-weight:bold}
button.option.selected{background:#264;color:#fff}
.instruction{background:#eef;padding:.4em;border-radius:4px}
.product{border-bottom:1px solid #ddd;padding:.4em 0}
"""


def render_html(page: Page, action_url: str) -> str:
    """The page as an HTML document whose buttons post their ``click[...]`` action to `action_url`.

    Args:
        page: the page.
        action_url: where forms post; the form field ``action`` holds the action text, or ``keywords`` holds the
            search words from the search box.
    """
    esc = html.escape
    body = []
    for e in page.elements:
        if e.hidden:
            continue
        click = esc(f"click[{e.key}]", quote=True)
        if e.kind == "search":
            body.append(f'<form method="post" action="{esc(action_url)}"><input id="search_input" name="keywords" '
                        f'placeholder="Search..." autofocus><button type="submit" class="btn search">'
                        f"{esc(e.text)}</button></form>")
        elif e.kind == "button":
            css = "btn buy" if e.key == "buy now" else "btn"
            body.append(f'<button form="act" name="action" value="{click}" class="{css}">{esc(e.text)}</button>')
        elif e.kind == "link":
            visited = " visited" if e.selected else ""
            body.append(f'<div class="product"><button form="act" name="action" value="{click}" '
                        f'class="product-link{visited}">{esc(e.text)}</button></div>')
        elif e.kind == "option":
            selected = " selected" if e.selected else ""
            body.append(f'<button form="act" name="action" value="{click}" class="option{selected}" '
                        f'data-option="{esc(e.group, quote=True)}">{esc(e.text)}</button>')
        elif e.text == "Instruction:":
            body.append('<p class="instruction"><b>Instruction:</b></p>')
        else:
            body.append(f"<p>{esc(e.text)}</p>")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>WebShop</title>"
        f"<style>{_CSS}</style></head><body>\n"
        f'<form id="act" method="post" action="{esc(action_url)}"></form>\n' + "\n".join(body) + "\n</body></html>\n"
    )
