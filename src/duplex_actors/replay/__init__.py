"""Replaying session logs: logic level (the session core over the logged records) and model
level (the real engine over the logged input frames)."""
