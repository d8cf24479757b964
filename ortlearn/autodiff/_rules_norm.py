"""Gradients of the normalisations: BatchNormalization, LayerNormalization, GroupNormalization, InstanceNormalization."""

from __future__ import annotations
