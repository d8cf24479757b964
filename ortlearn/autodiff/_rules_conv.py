"""Gradients of convolutions: Conv and ConvTranspose (1-D/2-D/3-D, groups, every attribute)."""

from __future__ import annotations
