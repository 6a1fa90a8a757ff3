"""Defaults that services on both sides of the stream must agree on, declared once.

Rollout producers bound staleness in the same units the trainer consumes: AReaL's episodes,
i.e. GRPO groups (one request each), and the same η.
"""

from __future__ import annotations

STALENESS_ETA = 4  # versions between the trainer and the oldest token it may train on
GROUPS_PER_BATCH = 8  # GRPO groups per optimiser step, all producers together
