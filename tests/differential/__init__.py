"""Differential tests: one client scenario against a broker directly and through a sidecar
(issue 14, "Transparency"). See :mod:`tests.differential.runner`."""
