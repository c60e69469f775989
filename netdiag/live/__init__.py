"""Live capture: packets from a network interface streamed to pcapng as they arrive."""

from netdiag.live.capture import (
    CapturePermissionError,
    CaptureStats,
    LiveCapture,
    embed_key_log,
    rotated_name,
)

__all__ = ["CapturePermissionError", "CaptureStats", "LiveCapture", "embed_key_log",
           "rotated_name"]
