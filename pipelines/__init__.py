"""Runnable pipelines and their command line (`beam-prep`)."""
