package command

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/seed-a1b882c0/idem/store/storeurl"
)

var migrateCommand = command{
	name: "migrate", args: "",
	summary: "Apply the PostgreSQL schema migrations to the table of a postgres:// store (safe to repeat).",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("migrate takes no arguments")
			}
			url := c.storeURL()
			if url == "" {
				return usagef("no store: give -store postgres://… or set $%s", EnvStore)
			}
			ms, err := storeurl.Migrate(ctx, url)
			if err != nil {
				return err
			}
			u, _ := storeurl.Parse(url)
			for _, m := range ms {
				fmt.Fprintf(c.env.Stdout, "%s: %s applied\n", u.Table, m.Name)
			}
			return nil
		}
	},
}

var createTableCommand = command{
	name: "create-table", args: "",
	summary: "Create the DynamoDB table of a dynamodb:// store (with its status index when the URL has index=) and wait until it is active.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		wait := fs.Duration("wait", 2*time.Minute, "how long to wait for the table to become active")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("create-table takes no arguments")
			}
			url := c.storeURL()
			if url == "" {
				return usagef("no store: give -store dynamodb://TABLE… or set $%s", EnvStore)
			}
			if err := storeurl.CreateTable(ctx, url, *wait); err != nil {
				return err
			}
			u, _ := storeurl.Parse(url)
			fmt.Fprintf(c.env.Stdout, "table %s is active\n", u.Table)
			fmt.Fprintf(c.env.Stdout, "As a global table, it is safe with one writing Region, or with multi-Region strong consistency (MRSC); never with writers in several Regions under eventual consistency (the default): two Regions could both claim a key. See docs/failover.md.\n")
			return nil
		}
	},
}
