"""What every layer uses: argument checks, plain-text tables, progress bars, hooks that hold their
owner weakly, and the comparison of what ranks computed with one process."""
