"""Mapping: a recognized file's result turned into a document record."""
