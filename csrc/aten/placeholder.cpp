int x_;
