"""Placeholder: registers the gated estimators in verl processes (see issue 4)."""
