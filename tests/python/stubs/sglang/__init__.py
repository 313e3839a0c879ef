# SPDX-License-Identifier: MIT
"""Stand-in package for the tests (see tests/python/stubs/README.md)."""
