"""Approval policies (issue 48): routing a call to the groups that own it (:mod:`.matching`), the
one check every decision goes through (:mod:`.check`), several approvals (:mod:`.quorum`),
telling a second group when nobody decides (:mod:`.escalation`), and a first-pass reviewer agent
(:mod:`.reviewer`). Their changes are recorded by :mod:`.history`."""
