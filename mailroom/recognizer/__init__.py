"""The reference recognition service: a separate program that speaks the recognition contract."""
