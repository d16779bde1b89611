"""`python -m train` is `beam-train`."""

from train.cli import main

if __name__ == "__main__":
  main()
