"""The sans-I/O SIP core: messages, URIs, SDP, transactions, dialogs, the user agent's router, digest
auth, registration, policy, transfer."""
