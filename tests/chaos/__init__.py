"""Chaos soak (issue 7): producers and consumers through sidecars against real brokers while a
seeded fault loop kills, hangs, blackholes, resets and slows them; see ``soak.py``."""

from __future__ import annotations
