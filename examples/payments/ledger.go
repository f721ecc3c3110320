package main

import (
	"errors"
	"fmt"
	"maps"
	"sync"
)

// ErrInsufficientFunds: a debit larger than the account's balance.
var ErrInsufficientFunds = errors.New("insufficient funds")

// Ledger holds the accounts' balances, in cents. Like a bank's API it
// takes an entry ID with every posting and applies each entry once, so a
// redelivered activity task cannot move money twice.
type Ledger struct {
	mu       sync.Mutex
	balances map[string]int64
	posted   map[string]bool
}

// NewLedger opens the accounts with the given balances.
func NewLedger(balances map[string]int64) *Ledger {
	return &Ledger{balances: maps.Clone(balances), posted: map[string]bool{}}
}

// Post adds delta to account under entry. An entry already posted is not
// posted again; a debit past the balance fails with ErrInsufficientFunds.
func (l *Ledger) Post(entry, account string, delta int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.posted[entry] {
		return nil
	}
	bal, ok := l.balances[account]
	if !ok {
		return fmt.Errorf("no account %q", account)
	}
	if bal+delta < 0 {
		return fmt.Errorf("%w: %s has %d, the transfer needs %d", ErrInsufficientFunds, account, bal, -delta)
	}
	l.balances[account] = bal + delta
	l.posted[entry] = true
	return nil
}

// Balances returns a copy of every balance.
func (l *Ledger) Balances() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.balances)
}
