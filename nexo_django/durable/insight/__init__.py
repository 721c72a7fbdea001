"""What the approvals dashboard reads: tallies written in the deciding commit (:mod:`.tally`),
the dashboard's numbers (:mod:`.dashboard`), suggested rules (:mod:`.suggest`), the picture of a
run (:mod:`.timeline`). No page here reads rows in proportion to the history."""
