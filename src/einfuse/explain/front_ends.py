"""The pictures of an einsum string's or einops pattern's explanation.  Their
explanations are built by the translators (frontends/einsum.py, frontends/einops.py),
which sit below the pictures; the front door wraps them here so that they draw as the
statement's page with the call first (docs/pictures.md)."""

from __future__ import annotations

from ..pictures import front_end_page, save_page


class FrontEndExplanation:
    """A translator's explanation (``str()`` unchanged, its fields readable as before)
    that also draws: ``page()``, ``_repr_html_()`` and ``save(path)``."""

    def __init__(self, explained):
        self.explained = explained

    def __getattr__(self, name):
        explained = self.__dict__.get("explained")    # (absent while copy or pickle build it)
        if explained is None:
            raise AttributeError(name)
        return getattr(explained, name)

    def __str__(self) -> str:
        return str(self.explained)

    def __repr__(self) -> str:
        return repr(self.explained)

    def page(self):
        """The statement's picture with this call first (docs/pictures.md)."""
        text = str(self)
        return front_end_page(self.explained.inner, text.split("\n\n")[0], text)

    def _repr_html_(self) -> str:
        return self.page().fragment()

    def save(self, path: str) -> None:
        save_page(self.page(), path)
