"""What a run reports: each round's console line, the final report, the privacy statement, the
plots and the release folder."""
