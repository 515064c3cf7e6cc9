"""Pages of a long list: which rows a page number asks for, and the links to its neighbours. Every list the app
shows is paged, so no page grows with the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flask import request, url_for


@dataclass(frozen=True)
class Page:
    """Page ``number`` (from 1) of ``size`` rows out of ``total``."""

    number: int
    size: int
    total: int

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def first_row(self) -> int:
        return min(self.total, self.offset + 1)

    @property
    def last_row(self) -> int:
        return min(self.total, self.offset + self.size)

    def url(self, number: int) -> str:
        """This request's URL at another page number (its other parameters kept)."""
        args = request.args.to_dict()
        args["page"] = str(number)
        return url_for(request.endpoint or "", **args)


LAST_PAGE_ASKED = 10**9
"""Page numbers above this are read as it: an offset past every row (an empty page), and never one past the int64
that DuckDB's OFFSET takes."""


def asked_page() -> int:
    """The page number in the request (``?page=``); 1 when absent or not a positive number."""
    try:
        return min(LAST_PAGE_ASKED, max(1, int(request.args.get("page", "1"))))
    except ValueError:
        return 1
