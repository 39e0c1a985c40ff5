"""Scores and their presentation as data: the leaderboard, tables for analysis and figures."""
