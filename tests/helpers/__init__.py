"""What tests share: imported as `helpers.<module>` (tests/ is on sys.path through its conftest).
No test module imports another test module."""
