"""The prefix-cached scorer every feature shares, its memory plan and finiteness checks; text scores and log-probs."""
