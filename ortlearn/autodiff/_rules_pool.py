"""Gradients of pooling and resampling: MaxPool, AveragePool, global pools, Pad, Resize, DepthToSpace/SpaceToDepth."""

from __future__ import annotations
