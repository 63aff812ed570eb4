"""What a run leaves behind: the one log schema, provenance, trackers, the stop line's projection, the
confusion matrix."""
