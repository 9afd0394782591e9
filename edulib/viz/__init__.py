"""Matplotlib figures drawn from edulib's models: what the widgets show and a handout prints."""
