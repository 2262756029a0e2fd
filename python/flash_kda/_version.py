# SPDX-License-Identifier: MIT
__version__ = "0.1.0"
