"""The enforcement ladder: an alert that keeps firing is warned about, then acted on."""
