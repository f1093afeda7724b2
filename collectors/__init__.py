"""Collectors: framework, op and engine events from one run, merged into one Perfetto trace."""
