"""Gradients of the recurrent operators: LSTM, GRU and RNN."""

from __future__ import annotations
