"""Notifications: who is told what, written as channel messages."""
