"""optimize stage."""
