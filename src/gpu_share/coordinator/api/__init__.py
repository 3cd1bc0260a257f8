"""Thin routers: parse, authorize through a dependency, call one service, return."""
