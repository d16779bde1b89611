"""`python -m pipelines` is `beam-prep`."""

from pipelines.cli import main

if __name__ == "__main__":
  main()
