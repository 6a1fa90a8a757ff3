"""The policy itself: a tiny one created offline, pretrained to copy and read, or a pretrained one
imported.
"""
