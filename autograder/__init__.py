"""Instructor tooling: releasing notebooks, collecting and autograding submissions."""
