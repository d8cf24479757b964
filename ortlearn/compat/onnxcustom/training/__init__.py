"""onnxcustom's ``onnxcustom.training`` package: its trainers, learning rates, losses, penalties."""
