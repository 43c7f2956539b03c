"""Drafters: each proposes continuations into the shared draft tree. See `base.Drafter`."""
