"""Benchmarks: side-by-side ratios measured in one run, written as JSON, a Markdown table and a plot."""
