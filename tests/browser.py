"""The headless browser the page tests drive: chromium, installed by
``scripts/setup.sh --with-test-services``; the tests that need it are skipped without it."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="chromium is installed by scripts/setup.sh --with-test-services")
