"""The units of time every core counts in: monotonic nanoseconds (`now`, deadlines), and milliseconds on the
wire and in the rules. One definition for the whole tree (rtp is its lowest room: everything may import it)."""

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
