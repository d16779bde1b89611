"""`python -m benchmarks [--quick] [--json PATH] [--plot PATH]`."""

from benchmarks.run import main

if __name__ == "__main__":
  main()
