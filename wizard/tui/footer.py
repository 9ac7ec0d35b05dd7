"""The key footer of the wizard's pages: Textual's, rebuilt only when the keys it shows change."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widgets import Footer


def shown_keys(screen: Screen[Any]) -> tuple[tuple[object, ...], ...]:
    """What a footer shows of a screen's bindings now: each shown key as the app displays it, its action, label,
    tooltip and whether it is enabled (the command palette's key too, which Textual shows though its binding is
    hidden)."""
    app = screen.app
    palette = app.COMMAND_PALETTE_BINDING
    return tuple(
        (
            key,
            app.get_key_display(binding),
            binding.action,
            binding.description,
            binding.tooltip,
            tooltip,
            enabled,
            binding.group,
        )
        for key, (_, binding, enabled, tooltip) in screen.active_bindings.items()
        if binding.show or key == palette
    )


class KeysFooter(Footer):
    """Textual's Footer, rebuilt only when the keys it shows change.

    Textual's rebuilds itself, one widget a key, at every change of the focus: moving from one field to the
    next rebuilt the same footer, and restyled it, each time. The keys change with the page and where a
    binding is enabled or not, never with the field, so this footer compares what it would show first.
    """

    _shown: tuple[tuple[object, ...], ...] | None = None

    def bindings_changed(self, screen: Screen[Any]) -> None:
        if self.is_attached and screen is self.screen and screen.app.app_focus:
            shown = shown_keys(screen)
            if self._bindings_ready and shown == self._shown:
                return
            self._shown = shown
        super().bindings_changed(screen)
