package console

import (
	"net/http"
	"strings"

	"github.com/seed-a1b882c0/idem/clientkey"
)

// find opens the record of what a client sent (the overview's search
// form): the store key is derived by package clientkey, the function the
// adapter itself keys its records with, and the answer is a redirect to
// the record page. Parameters: kind (http, gateway, grpc, key, json,
// payload), operation, method, route, principal, tenant, topic, key.
func (c *Console) find(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	m := clientkey.Material{
		Kind:      clientkey.Kind(q.Get("kind")),
		Operation: strings.TrimSpace(q.Get("operation")),
		Method:    strings.TrimSpace(q.Get("method")),
		Route:     strings.TrimSpace(q.Get("route")),
		Principal: q.Get("principal"),
		Tenant:    strings.TrimSpace(q.Get("tenant")),
		Topic:     strings.TrimSpace(q.Get("topic")),
		Key:       q.Get("key"), // as the client sent it: spaces and quotes are part of it
	}
	key, err := m.StoreKey()
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, "Cannot derive a store key from this: "+err.Error())
		return
	}
	http.Redirect(w, r, c.recordURL(key.String()), http.StatusSeeOther)
}
